"""The attention backends a rank can run, by name: the one list that the CLI offers and that
``attention_backend.select_attention_backend`` dispatches on (importing it costs no torch)."""

ATTENTION_BACKENDS = ("auto", "torch", "native", "triton")
