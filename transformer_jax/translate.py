"""Kept so that `from transformer_jax.translate import Translator` goes on working; the code is in
transformer_jax/inference/translate.py."""

from transformer_jax.inference.translate import translate_files, Translator  # noqa: F401
