"""What the model is trained to do, one object a task, chosen by `data.task` (registry.py):
how a split is read, what the vocabulary must allow, how outputs are post-processed, scored and
compared, and what constrains the search. Imports data, the model and decoding."""
