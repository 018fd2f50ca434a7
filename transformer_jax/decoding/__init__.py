"""Decoding a trained model: beam search (paper §6.1) with a KV cache, greedy, ensembles.
Imports the runtime and the model."""
