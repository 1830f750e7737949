"""`asr-serve`: one model pair and one scheduler behind FastAPI in one process (docs/serving.md), or the same
app on Ray Serve with decoder replicas (`--engine ray`, docs/scale.md).

- `api.py`      OpenAI-compatible `/v1/audio/transcriptions`, `/v1/audio/translations`, `/v1/models`
- `live.py`     the WebSocket endpoint for live audio (`/v1/live`)
- `metrics.py`  `/metrics` in Prometheus' text format
- `security.py` API key, CORS, the refusal answers
- `app.py`      the FastAPI app: the routes above, `/health`, and the Gradio app mounted at `/`
- `cli.py`      the command line
- `ray_engine.py`, `ray_launch.py`, `ray_batching.py`  `--engine ray`: the deployments, starting and stopping
  them, and the `@serve.batch` alternative to the scheduler in a replica

It composes the web app (`asr_app.ui`), so it sits above the other front ends: none of them imports it.
"""
