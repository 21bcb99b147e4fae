"""Stage 1, the data: from the source archive to prepared folders and their manifest.

    download / synthetic -> source -> prepare (images) -> data/{standard,augmented}/... + manifest.json
                                                       -> loading

`download` fetches the PetImages archive (resumable, verified); `synthetic` makes an offline
stand-in laid out like it; `source` turns a URL, zip, folder or "synthetic" into a verified,
safely extracted PetImages folder; `prepare` validates, selects, splits and writes exactly as the
article did, each image's pixels made by `images` (the article's resize, save and augmented
copy) in decode processes, and writes the manifest last (catsdogs.manifest: the contract with
every later stage); `loading` decodes prepared folders once into memory and orders each
epoch's batches. Nothing here imports Keras, TensorFlow or JAX (tests/architecture/test_layout.py).
"""
