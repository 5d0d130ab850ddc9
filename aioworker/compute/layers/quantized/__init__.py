"""Linear methods whose parameters are quantized values: quantized while a dense checkpoint
loads (model.quantization on a GPU) or loaded as a quantized checkpoint stores them."""
