"""Building blocks the models share: normalisation, rotary embeddings, attention."""
