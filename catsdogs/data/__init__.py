"""Stage 1, the data: from the source archive to prepared folders and their manifest.

    download / synthetic -> prepare -> data/{standard,augmented}/... + manifest.json -> loading

`download` fetches the PetImages archive (resumable, verified); `synthetic` makes an offline
stand-in laid out like it; `prepare` extracts, validates, selects, splits, resizes and augments
exactly as the article did; `manifest` is the mark of a finished prepare and the data's
identity; `loading` decodes prepared folders once into memory and orders each epoch's batches.
Nothing here imports Keras, TensorFlow or JAX (tests/test_layout.py).
"""
