"""Using a trained workdir: loading it, translating, and evaluating (BLEU, chrF, TER, F1).
Imports the layers below, training for checkpoints."""
