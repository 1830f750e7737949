"""The Gradio web app (`python app.py`): the Live, File and Compare tabs over one loaded model pair.

`main` is imported on first use (asr_app/lazy.py): the engine and the tab logic load without Gradio."""

from asr_app.lazy import lazy_exports

__all__ = ["main"]
__getattr__ = lazy_exports(__name__, {"main": "app"})
