"""The model (paper §3): attention, masks, positions, embeddings, the encoder-decoder stack
and its sharding rules. Imports only `runtime` of the layers below it.
"""
