"""Building blocks of the decoder: linear (tensor-parallel), norm, rotary, embedding, attention."""
