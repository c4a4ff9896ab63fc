"""Inside the training process: the Trainer callback (`transformers.py`) and `loradoctor.watch()`
(`watch.py`) write the same timeline as `loradoctor run`. Importing loradoctor imports none of them."""
