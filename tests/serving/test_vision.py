"""Images: a vision recipe describes what it is shown; a text-only recipe refuses an image cleanly."""

import pytest

from sparkgate.probes import chat_body, image_content, picture
from sparkgate.sanity import diagnosed_by


@pytest.mark.check("SERVE-VISION", why="a vision tower that loads but sees nothing (wrong processor, image "
                   "dropped by the template) answers fluently about an image it never saw",
                   fix="check that the image processor is the model's own (processor_config.json or "
                       "preprocessor_config.json beside the weights: its size, mean and std), the image's multimodal "
                       "support for this model, --limit-mm-per-prompt and --media-io-kwargs in the serve args, and "
                       "the server log for the processor")
@pytest.mark.parametrize("kind", ["digits", "shape"])
def test_an_image_with_known_content_is_described_correctly(check, server, recipe, endpoint, kind):
    """An image drawn by the suite with known content MUST be described correctly."""
    if not recipe.features.vision:
        check.cannot_run(f"recipe {recipe.name} does not declare vision (features.vision: false); "
                         "SERVE-VISION-REJECT checks that it refuses images", "set features.vision: true")
    pic = picture(kind)
    body = chat_body(server.served_name, image_content(pic.question, pic.data_url), max_tokens=512)
    text = endpoint.chat(body, label=f"the {kind} image")["choices"][0]["message"].get("content") or ""
    check.that(pic.answered(text),
               expected=f"{' or '.join(pic.answers)} in the answer to {pic.question!r}", found=repr(text[:200]))


@pytest.mark.check("SERVE-VISION-REJECT", why="agents send screenshots; a text-only server must say it cannot "
                   "see them, not crash (5xx), hang, or answer as if it had",
                   fix="read the server log for the request: a 5xx here is a server bug; upgrade the image")
def test_a_text_only_model_refuses_an_image_with_a_4xx(check, server, recipe, endpoint):
    """A text-only recipe MUST answer an image with a 4xx whose message says why."""
    if recipe.features.vision:
        check.cannot_run(f"recipe {recipe.name} declares vision; SERVE-VISION checks images")
    pic = picture("shape")
    body = chat_body(server.served_name, image_content(pic.question, pic.data_url), max_tokens=16)
    response = endpoint.post(body, timeout=120)
    message = endpoint.error_message(response)
    says_why = any(w in message.lower() for w in ("image", "multimodal", "vision", "modalit"))
    why = None
    if response.status_code >= 500 and endpoint.post(content=b"{").status_code >= 500:
        # Not the image: every client error comes back as a 5xx, which SERVE-BAD-INPUT diagnoses.
        why = ("a body that is not JSON gets a 5xx here too: every client error is answered as a server error "
               + diagnosed_by("SERVE-BAD-INPUT", "bad input answered without a 4xx"))
    check.that(400 <= response.status_code < 500 and says_why,
               expected="HTTP 4xx with an error message about images / multimodal input",
               found=f"HTTP {response.status_code}: {response.text[:300]!r}", why=why)
