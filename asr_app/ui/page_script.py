"""A script the web app's page runs (passed to Gradio as `head`), for a race in Gradio's streaming microphone.

Gradio builds the live recorder from a module it loads, and with a WAV encoder it registers, both
asynchronously after the page shows (it does not wait for the registration). A Record click that lands
before them fails inside Gradio, uncaught ("ge is not a constructor" before the module loaded,
NotSupportedError "audio/wav is not supported" before the encoder registered): the button turns into Stop
while nothing is recorded or sent, for as long as the person waits. Seen on a loaded machine, where these
take seconds, in about half of the clicks made as soon as the page showed. The script notices those two
failures right after a Record click on the live microphone and, once the recorder has had time to load,
presses Stop and then Record when Gradio shows it again; the second click builds the recorder anew. A click
of the person's own cancels a pending retry.
"""

from __future__ import annotations

from string import Template

LIVE_MIC_ID = "asr-live-mic"
RETRY_AFTER_MS = 2000      # the recorder's modules have had time to load (seconds on a loaded machine)
MAX_RETRIES = 10
CLICK_WINDOW_MS = 5000     # a failure this soon after a Record click is that click's
GIVE_UP_AFTER_MS = 10000   # Record not back this long after Stop: leave the page to the person

_SCRIPT = Template("""<script>
(() => {
  const mic = '#$mic_id';
  let retries = 0, recordClickedAt = -Infinity, pending = null;
  const find = (selector) => document.querySelector(mic + ' ' + selector);
  // Gradio's two failures: its recorder class not loaded yet, or its WAV encoder not registered yet.
  const recorderNotReady = (reason) => !!reason && (
    (reason.name === 'TypeError' && /not a constructor/.test(reason.message)) ||
    (reason.name === 'NotSupportedError' && /audio\\/wav/.test(reason.message)));
  const cancel = () => { if (pending !== null) { clearInterval(pending); pending = null; } };
  document.addEventListener('click', (event) => {
    if (!(event.target instanceof Element) || !event.target.closest(mic)) return;
    if (event.isTrusted) { cancel(); retries = 0; }   // the person's own click wins over a pending retry
    if (event.target.closest(mic + ' .record-button')) recordClickedAt = performance.now();
  }, true);
  window.addEventListener('unhandledrejection', (event) => {
    if (performance.now() - recordClickedAt > $click_window_ms || retries >= $max_retries) return;
    if (!recorderNotReady(event.reason)) return;
    retries += 1;
    recordClickedAt = -Infinity;
    cancel();
    console.warn('asr-app: the microphone recorder was not ready (' + event.reason + '); pressing Record again');
    const failedAt = performance.now();
    let stopped = false;
    pending = setInterval(() => {   // after a pause press Stop, then Record once Gradio shows it again
      const waited = performance.now() - failedAt;
      if (waited < $retry_after_ms) return;
      if (!stopped) {
        const stop = find('.stop-button') || find('.spinner-button') || find('.stop-button-paused');
        if (stop) stop.click();
        stopped = true;
        return;
      }
      const record = find('.record-button');
      if (record) { cancel(); record.click(); }
      else if (waited > $retry_after_ms + $give_up_after_ms) cancel();
    }, 100);
  });
})();
</script>""")

RECORDER_RETRY_HEAD = _SCRIPT.substitute(mic_id=LIVE_MIC_ID, click_window_ms=CLICK_WINDOW_MS, max_retries=MAX_RETRIES,
                                        retry_after_ms=RETRY_AFTER_MS, give_up_after_ms=GIVE_UP_AFTER_MS)
