"""Every form a server could echo the API key in (the 21 of the outside probe and more) leaves loadgen's redaction
with no 6 characters of the key in a row in any decoding; text without the key passes unchanged."""

import base64

import pytest

from bench.benchmarks.hostile_probe import FORMS, KEY  # noqa: E402 (the probe's forms: one list)
from loadgen.redact import WINDOW, WITHHELD, _encoded, redact


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
