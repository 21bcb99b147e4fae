from catsdogs.cli import main

main()
