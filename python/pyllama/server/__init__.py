"""``pyllama serve``: an OpenAI- and llama-server-compatible HTTP server.

:class:`Engine` (engine.py) owns one context and its scheduler thread (continuous batching
over slots); :func:`create_app` (app.py) is the ASGI app; ray.py runs the same engine as
Ray Serve replicas. Needs ``pip install 'pyllama[server]'`` (starlette, uvicorn).
"""

from .app import ServerConfig, ServerState, create_app
from .engine import Engine, EngineConfig, Job

__all__ = ["Engine", "EngineConfig", "Job", "ServerConfig", "ServerState", "create_app"]
