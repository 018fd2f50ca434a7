"""The model (paper §3): attention, masks, positions, embeddings, the encoder-decoder stack,
and the sharding rules of its parameters. Imports only the runtime."""
