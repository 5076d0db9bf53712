"""Every form a server could echo the API key in (the 21 of the outside probe and more) leaves loadgen's redaction
with no 6 characters of the key in a row in any decoding; text without the key passes unchanged."""

import base64
import html
import json
import urllib.parse

import pytest

from loadgen.redact import WINDOW, WITHHELD, _encoded, redact

KEY = "sk-live-Zq81/hostile+KEY-Xw9QpLm7RtVb"
P7 = [KEY[i:i + 7] for i in range(0, 21, 7)]
FORMS = {
    "raw": KEY, "upper": KEY.upper(), "lower": KEY.lower(), "prefix-12": KEY[:12], "suffix-10": KEY[-10:],
    "json-slash": json.dumps(KEY).replace("/", "\\/"), "json-u": "".join(f"\\u{ord(c):04x}" for c in KEY),
    "json-U": "".join(f"\\u{ord(c):04X}" for c in KEY), "json-ensure-ascii": json.dumps({"k": KEY}),
    "base64": base64.b64encode(KEY.encode()).decode(), "base64-url": base64.urlsafe_b64encode(KEY.encode()).decode(),
    "base64-in-blob-1": base64.b64encode(b"x" + KEY.encode()).decode(),
    "base64-in-blob-2": base64.b64encode(b"{'k': '" + KEY.encode() + b"'}").decode(),
    "base64-unpadded": base64.b64encode(KEY.encode()).decode().rstrip("="),
    "hex": KEY.encode().hex(), "HEX": KEY.encode().hex().upper(), "hex-spaced": KEY.encode().hex(" "),
    "hex-colons": KEY.encode().hex(":"), "html-dec": "".join(f"&#{ord(c)};" for c in KEY),
    "html-hex": "".join(f"&#x{ord(c):x};" for c in KEY), "html-escaped": html.escape(KEY),
    "percent-all": "".join(f"%{b:02X}" for b in KEY.encode()), "quote": urllib.parse.quote(KEY, safe=""),
    "quote-plus": urllib.parse.quote_plus(KEY), "reversed": KEY[::-1], "reversed-upper": KEY[::-1].upper(),
    "pieces-7": f"part {P7[0]} then {P7[1]} and {P7[2]}", "pieces-6": " / ".join(KEY[i:i + 6] for i in (0, 6, 12)),
    "spaced": " ".join(KEY), "spaced-newlines": "\n".join(KEY), "spaced-reversed": " ".join(KEY[::-1]),
    "tabbed-hex": "\t".join(f"{b:02x}" for b in KEY.encode()), "percent-of-json-u":
        urllib.parse.quote("".join(f"\\u{ord(c):04x}" for c in KEY)),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_no_form_of_the_key_survives(form):
    body = f'{{"error": {{"message": "invalid key", "echo": "{FORMS[form]}", "code": 401}}}}'
    out = redact(body, KEY)
    assert not _encoded(out, KEY), (form, out)
    for i in range(len(KEY) - WINDOW + 1):
        assert KEY[i:i + WINDOW].lower() not in out.lower(), (form, out)
    assert out == WITHHELD or "***" in out


def test_text_without_the_key_is_kept():
    texts = ["Bad request: model 'glm-4.6' not found", "rate limited; retry after 3 s (request 9f1c2e7a-77b1-4c0e)",
             base64.b64encode(b"some other token value 0123").decode(), "deadbeefcafe0123456789abcdef",
             "&#104;&#101;&#108;&#108;&#111; world", "%48%65%6C%6C%6F"]
    for t in texts:
        assert redact(t, KEY) == t
    assert redact("Authorization: Bearer abc.def", "") == "Authorization: Bearer ***"
