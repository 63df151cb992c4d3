"""llama.h-style functions: see llama_api.py."""

__all__: list[str] = []
