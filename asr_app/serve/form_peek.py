"""The plain fields a multipart upload sends before its file, read from the body's bytes as they pass by.

FastAPI parses the whole form (the file spooled to disk) before a handler sees a field, so a request for a model
this server does not run was refused only after its upload was received. Clients send their fields first (the
`openai` package and httpx write form fields before files; so do browsers in form order), so the upload gate
can read them on the way and refuse such a request once its file begins. The app's own parser still reads the
form: this only looks, and it stops looking at the first file (or anything it cannot parse, which the app's
parser then reports in its own way).
"""

from __future__ import annotations

from python_multipart.multipart import MultipartParser, parse_options_header

FIELD_BYTES = 1024   # of one watched field's value; a longer one is left to the app's own check


class FormPeek:
    """Feed it the body's chunks; `fields` holds the watched fields seen before the first file (values in the
    order sent), `done` turns true when that file begins, the form ends, or the body is not a form it can read."""

    def __init__(self, content_type: str | None, watched: frozenset[str]) -> None:
        self.watched = watched
        self.fields: dict[str, list[str]] = {}
        self.file_began = False
        self.done = True
        self._header_name = b""
        self._header_value = b""
        self._name: str | None = None
        self._value = bytearray()
        kind, params = parse_options_header(content_type)
        boundary = params.get(b"boundary")
        if kind != b"multipart/form-data" or not boundary:
            return
        try:   # e.g. a boundary past python_multipart's 256 bytes: the app's parser answers it with a 400
            self._parser = MultipartParser(boundary, callbacks={
                "on_part_begin": self._part_begin, "on_header_field": self._header_field,
                "on_header_value": self._header_value_part, "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished, "on_part_data": self._part_data,
                "on_part_end": self._part_end, "on_end": self._end})
        except Exception:  # noqa: BLE001
            return
        self.done = False

    def feed(self, chunk: bytes) -> None:
        if self.done or not chunk:
            return
        try:
            self._parser.write(chunk)
        except Exception:  # noqa: BLE001 - not a form this can read: the app's parser answers it
            self.done = True

    def _part_begin(self) -> None:
        self._name, self._value = None, bytearray()
        self._header_name = self._header_value = b""

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def _header_value_part(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        if self._header_name.lower() == b"content-disposition":
            _, params = parse_options_header(self._header_value)
            if b"filename" in params:
                self.file_began = self.done = True
                self._parser.callbacks = {}   # the rest of the body is the file's: nothing more to look at
            else:
                self._name = params.get(b"name", b"").decode("utf-8", "replace")
        self._header_name = self._header_value = b""

    def _headers_finished(self) -> None:
        if self._name not in self.watched:
            self._name = None

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._name is not None and len(self._value) <= FIELD_BYTES:
            self._value += data[start:end]

    def _part_end(self) -> None:
        if self._name is not None and len(self._value) <= FIELD_BYTES:
            self.fields.setdefault(self._name, []).append(self._value.decode("utf-8", "replace"))
        self._name = None

    def _end(self) -> None:
        self.done = True
