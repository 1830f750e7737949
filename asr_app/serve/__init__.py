"""`asr-serve`: one process, one model pair, one scheduler, behind FastAPI (docs/serving.md).

- `api.py`      OpenAI-compatible `/v1/audio/transcriptions`, `/v1/audio/translations`, `/v1/models`
- `live.py`     the WebSocket endpoint for live audio (`/v1/live`)
- `metrics.py`  `/metrics` in Prometheus' text format
- `security.py` API key, CORS, the refusal answers
- `app.py`      the FastAPI app: the routes above, `/health`, and the Gradio app mounted at `/`
- `cli.py`      the command line

It composes the web app (`asr_app.ui`), so it sits above the other front ends: none of them imports it.
"""
