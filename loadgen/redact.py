"""The API key kept out of whatever a server sends back, in every form a server could echo it.

Two steps. First, any WINDOW characters in a row of the key (as given, reversed, JSON- or URL-escaped, in any case,
with or without blanks between its characters) become ***, with the key-like characters around them: a key cut in
pieces of 6 or more characters, or spaced out, is caught where it stands. Then the text is decoded every way a
server might have encoded it (JSON \\u escapes, HTML entities, percent-encoding, hex, base64 at every alignment;
each also reversed and without blanks); if a decoding still holds WINDOW characters of the key, the whole text is
withheld, since where the key lies in the encoded text cannot be told character by character.
"""

from __future__ import annotations

import base64
import binascii
import html
import json
import re
from functools import cache
from urllib.parse import quote, quote_plus, unquote, unquote_plus

WINDOW = 6  # this many characters of the key in a row are the key
SCAN_MAX = 1 << 20  # characters of a text decoded and searched (a server's error text is far shorter)
WITHHELD = "*** (the server's text held the API key in an encoded form; withheld)"
_BEARER = re.compile(r"bearer\s+\S+", re.IGNORECASE)
_KEY_CHARS = r"[A-Za-z0-9_\-\\/%+.~]*"
_UNICODE = re.compile(r"\\u([0-9a-fA-F]{4})|\\x([0-9a-fA-F]{2})")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2}[\s:,-]?){6,}")
_B64 = re.compile(r"[A-Za-z0-9+/_-]{8,}")
_BLANKS = re.compile(r"\s+")


def redact(text: str, secret: str = "") -> str:
    """`text` without the key (see the module's account); any `Bearer ...` token is blanked too."""
    if secret and len(secret) >= 4:
        text = _pattern(secret).sub("***", text)
        if _encoded(text, secret):
            return WITHHELD
    return _BEARER.sub("Bearer ***", text)


def _windows(form: str) -> list[str]:
    n = min(WINDOW, len(form))
    return sorted({form[i:i + n] for i in range(len(form) - n + 1)}, key=len, reverse=True)


@cache
def _pattern(secret: str) -> re.Pattern:
    forms = {secret, secret[::-1], secret.replace("/", "\\/"), json.dumps(secret)[1:-1], quote(secret, safe=""),
             quote_plus(secret)}
    spaced = (r"\s*".join(re.escape(c) for c in w) for f in forms for w in _windows(f))
    return re.compile(f"{_KEY_CHARS}(?:{'|'.join(spaced)}){_KEY_CHARS}", re.IGNORECASE)


def _encoded(text: str, secret: str) -> bool:
    """Whether any decoding of `text` holds WINDOW characters of the key."""
    text = text[:SCAN_MAX]
    views = [text, html.unescape(text), unquote(text), unquote_plus(text), _unescape(text)]
    views += [_unescape(html.unescape(unquote(text)))]
    views += [_hex(v) for v in (text, _BLANKS.sub("", text))] + [_base64(text)]
    keys = [w.lower() for w in _windows(secret)]
    for view in views:
        for v in (view, view[::-1], _BLANKS.sub("", view)):
            low = v.lower()
            if any(k in low for k in keys):
                return True
    return False


def _unescape(text: str) -> str:
    return _UNICODE.sub(lambda m: chr(int(m.group(1) or m.group(2), 16)), text).replace("\\/", "/")


def _hex(text: str) -> str:
    """Every run of hex digit pairs decoded (both alignments), one decoding a line."""
    out = []
    for m in _HEX.finditer(text):
        digits = re.sub(r"[^0-9a-fA-F]", "", m.group(0))
        for start in (0, 1):
            chunk = digits[start:len(digits) - (len(digits) - start) % 2]
            out.append(bytes.fromhex(chunk).decode("latin-1"))
    return "\n".join(out)


def _base64(text: str) -> str:
    """Every run of base64 (standard or URL-safe) decoded at each of its four alignments, one decoding a line."""
    out = []
    for m in _B64.finditer(text):
        run = m.group(0).replace("-", "+").replace("_", "/")
        for start in range(4):
            chunk = run[start:]
            chunk = chunk[:len(chunk) - len(chunk) % 4]
            try:
                out.append(base64.b64decode(chunk, validate=True).decode("latin-1"))
            except (binascii.Error, ValueError):
                continue
    return "\n".join(out)
