"""What the model is trained to do, one module a task: how a split is read, how targets are
built, how outputs are post-processed and scored. Imports data, the model and decoding."""
