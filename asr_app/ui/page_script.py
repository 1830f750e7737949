"""A script the web app's page runs (passed to Gradio as `head`), for a race in Gradio's streaming microphone.

Gradio builds the live recorder from a module it loads, and with a WAV encoder it registers, both
asynchronously after the page shows (it does not wait for the registration). A Record click that lands
before them fails inside Gradio, uncaught ("ge is not a constructor" before the module loaded,
NotSupportedError "audio/wav is not supported" before the encoder registered): the button turns into Stop
while nothing is recorded or sent, for as long as the person waits. Seen on a loaded machine, where these
take seconds, in about half of the clicks made as soon as the page showed. The script notices an uncaught
failure right after a Record click on the live microphone and presses Stop and Record again once the
recorder has had time to load; the second click builds the recorder anew.
"""

from __future__ import annotations

LIVE_MIC_ID = "asr-live-mic"
RETRY_AFTER_MS = 2000
MAX_RETRIES = 10
CLICK_WINDOW_MS = 5000   # an uncaught failure this soon after a Record click is taken for the recorder's

RECORDER_RETRY_HEAD = f"""<script>
(() => {{
  let retries = 0, recordClickedAt = -Infinity;
  const button = (kind) => document.querySelector('#{LIVE_MIC_ID} .' + kind + '-button');
  const press = (kind) => {{ const b = button(kind); if (b) b.click(); return !!b; }};
  document.addEventListener('click', (event) => {{
    if (event.target instanceof Element && event.target.closest('#{LIVE_MIC_ID} .record-button')) {{
      recordClickedAt = performance.now();
    }}
  }}, true);
  window.addEventListener('unhandledrejection', (event) => {{
    if (performance.now() - recordClickedAt > {CLICK_WINDOW_MS} || retries >= {MAX_RETRIES}) return;
    retries += 1;
    recordClickedAt = -Infinity;
    console.warn('asr-app: the microphone recorder was not ready (' + event.reason + '); pressing Record again');
    setTimeout(() => {{ if (press('stop')) setTimeout(() => press('record'), 300); }}, {RETRY_AFTER_MS});
  }});
}})();
</script>"""
