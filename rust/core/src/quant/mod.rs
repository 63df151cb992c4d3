//! Quantized block formats: layout, dequantize, quantize (activations / KV), vec_dot.
//! Every SIMD kernel has a scalar `_ref` twin; the choice is made once at run time.
