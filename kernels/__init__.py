"""Pure tensor functions (paged attention, norms, rotary, activations), each with a torch reference."""
