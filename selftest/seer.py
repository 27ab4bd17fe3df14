"""A model that really sees, made here: a vision-language model of SmolVLM's architecture (Idefics3: a vision
transformer, pixel shuffle, a linear connector into the language model's embeddings), whose language model is the
embedded SmolLM2-135M-Instruct, unchanged, and whose small vision tower is trained here, on the CPU, on images
generated here: two-digit numbers written in black and discs and squares in seven colours, on white. No such model
ships on the package registries, and the CPU engine serves this architecture without torchvision (vLLM's LLaVA
imports it, and PyPI's torchvision wheels are CUDA builds that do not load beside the CPU torch).

The tower learns to put into the language model what the image shows, in its own words: its four image tokens are
trained towards the embeddings of " number 47" or " a red disc.", so the unchanged language model reads them and
answers the question about the image. What it learned is measured on images it was not trained on and stamped beside
the weights.

    python -m selftest.madehere smollm2-see [--force]

builds it once into the cache (SPARKGATE_CACHE/models/smollm2-see). Its broken twin is a serving choice, not other
weights: the image processor of another model (WRONG_PROCESSOR: CLIP's normalisation where the tower was trained on
pixels scaled to [-1, 1]), so the tower sees every pixel shifted and misreads what it shows.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from importlib import metadata
from pathlib import Path

from sparkgate import embedded
from sparkgate.proc import cache_dir

from .madehere import Made

IMAGE, PATCH, SCALE = 64, 16, 2  # 16 patches, merged 2 x 2 by the pixel shuffle: 4 image tokens
TOKENS = (IMAGE // PATCH) ** 2 // SCALE**2
TOWER = {"hidden_size": 192, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 6}
SEED, STEPS, BATCH, LR, IMAGES, HELD_OUT = 20261206, 1500, 64, 2e-3, 6000, 400
COLOURS = {"red": (220, 20, 20), "green": (30, 160, 40), "blue": (30, 60, 210), "yellow": (235, 210, 20),
           "orange": (240, 130, 20), "purple": (130, 40, 160), "black": (0, 0, 0)}
IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]  # Idefics3's own
# SmolLM2's template, each image part of a message written where it stands (the processor expands <image>).
TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>"
            "system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
            "{{ '<|im_start|>' + message['role'] + '\n' }}{% if message['content'] is string %}"
            "{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}"
            "{{ part['text'] }}{% else %}{{ '<image>' }}{% endif %}{% endfor %}{% endif %}{{ '<|im_end|>\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# The twin's processor settings: CLIP's mean and spread, where the tower was trained on SigLIP's (0.5, 0.5).
WRONG_PROCESSOR = {"image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258,
                                                                                      0.27577711]}


def draw(rng: random.Random):
    """An image as the suite draws its own (448 x 448, white; sparkgate.probes.picture) and what it shows, in the
    words the tower learns: a number from 10 to 99 in Pillow's default font, or a disc or square in a colour, each
    of varied size, place and shade."""
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (448, 448), "white")
    pen = ImageDraw.Draw(img)
    if rng.random() < 0.5:
        n = rng.randint(10, 99)
        where = (224 + rng.randint(-30, 30), 224 + rng.randint(-30, 30))
        pen.text(where, str(n), fill=(rng.randint(0, 60),) * 3, font=ImageFont.load_default(size=rng.randint(200, 300)),
                 anchor="mm")
        return img, f" number {n}"
    name, rgb = rng.choice(list(COLOURS.items()))
    shade = tuple(max(0, min(255, c + rng.randint(-25, 25))) for c in rgb)
    r, x, y = rng.randint(100, 180), 224 + rng.randint(-40, 40), 224 + rng.randint(-40, 40)
    shape = rng.choice(["disc", "square"])
    (pen.ellipse if shape == "disc" else pen.rectangle)((x - r, y - r, x + r, y + r), fill=shade)
    return img, f" a {name} {shape}."


def _digest() -> str:
    """This file and what draws and reads its images: a change to any of them builds the model again."""
    versions = " ".join(metadata.version(p) for p in ("transformers", "pillow", "torch"))
    return hashlib.sha256(Path(__file__).read_bytes() + versions.encode()).hexdigest()[:16]


def _train(tmp: Path, log) -> dict:
    import torch
    from transformers import (
        AutoTokenizer,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
        Idefics3VisionConfig,
        LlamaConfig,
        LlamaForCausalLM,
    )

    base = embedded.prepare("embedded:smollm2", cache_dir())
    torch.manual_seed(SEED)
    rng = random.Random(SEED)
    tok = AutoTokenizer.from_pretrained(base)
    tok.add_special_tokens({"additional_special_tokens": IMAGE_TOKENS})
    text = LlamaConfig.from_pretrained(base)
    text.vocab_size, text.tie_word_embeddings = len(tok), False
    config = Idefics3Config(vision_config=Idefics3VisionConfig(image_size=IMAGE, patch_size=PATCH, **TOWER).to_dict(),
                            text_config=text.to_dict(), scale_factor=SCALE, tie_word_embeddings=False,
                            image_token_id=tok.convert_tokens_to_ids("<image>"), pad_token_id=tok.pad_token_id)
    # Built in float32 (the text config, SmolLM2's, names bfloat16), as the CPU engine serves it.
    model = Idefics3ForConditionalGeneration(config).to(torch.float32)
    lm = LlamaForCausalLM.from_pretrained(base, dtype=torch.float32)
    lm.resize_token_embeddings(len(tok), mean_resizing=True)
    model.model.text_model.load_state_dict(lm.model.state_dict())
    model.lm_head.weight.data.copy_(lm.model.embed_tokens.weight.data)
    model.model.text_model.requires_grad_(False)  # the language model stays the embedded one
    processor = Idefics3Processor(
        image_processor=Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": IMAGE},
                                                  max_image_size={"longest_edge": IMAGE}),
        tokenizer=tok, image_seq_len=TOKENS, chat_template=TEMPLATE)

    def pixels(images, **settings):  # as the processor hands them to the tower: (images, 1, 3, IMAGE, IMAGE)
        out = processor.image_processor(images, return_tensors="pt", **settings)["pixel_values"]
        return out.reshape(len(images), 1, 3, IMAGE, IMAGE)

    t0 = time.monotonic()
    chunks, words = [], []
    for start in range(0, IMAGES, 500):  # drawn and reduced in chunks: 6,000 drawings at once held gigabytes
        images, said_words = zip(*(draw(rng) for _ in range(min(500, IMAGES - start))), strict=True)
        chunks.append(pixels(list(images)))
        words += said_words
        if start == 0:  # the held-out images as the twin's processor shows them too
            wrong = pixels(list(images[:HELD_OUT]), **WRONG_PROCESSOR)
    pixels_all = torch.cat(chunks)
    targets = torch.tensor([tok(w, add_special_tokens=False).input_ids for w in words])
    assert targets.shape == (IMAGES, TOKENS), "every description is exactly as many tokens as the image has"
    log(f"seer: {IMAGES} images drawn in {time.monotonic() - t0:.0f} s")
    embeddings = model.model.text_model.embed_tokens.weight.detach()
    vocabulary = torch.unique(targets)  # the words the tower may say
    classes = torch.searchsorted(vocabulary, targets)
    unit = torch.nn.functional.normalize

    def said(px):  # what the tower puts into the language model for each image: (images, TOKENS, hidden)
        return model.model.get_image_features(pixel_values=px).pooler_output.reshape(len(px), TOKENS, -1)

    def read(out):  # the words the language model is closest to reading, by cosine
        return vocabulary[(unit(out, dim=-1) @ unit(embeddings[vocabulary], dim=-1).T).argmax(-1)]

    tower = [*model.model.vision_model.parameters(), *model.model.connector.parameters()]
    optimizer = torch.optim.AdamW(tower, lr=LR)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=LR, total_steps=STEPS, pct_start=0.1)
    model.train()
    for step in range(STEPS):
        batch = torch.randint(HELD_OUT, IMAGES, (BATCH,))  # the first HELD_OUT images are never trained on
        out = said(pixels_all[batch])
        # Close to the words' embeddings (what the language model reads), and closer to the right word than to the
        # others it might say (what tells 4 from 7).
        logits = unit(out, dim=-1) @ unit(embeddings[vocabulary], dim=-1).T * 20
        loss = (100 * torch.nn.functional.mse_loss(out, embeddings[targets[batch]])
                + torch.nn.functional.cross_entropy(logits.reshape(-1, len(vocabulary)), classes[batch].reshape(-1)))
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if step % 200 == 0 or step == STEPS - 1:
            log(f"seer: step {step + 1} of {STEPS}, loss {loss.item():.3f}, {time.monotonic() - t0:.0f} s")
    model.eval()
    numbers = torch.tensor([w.startswith(" number") for w in words[:HELD_OUT]])

    def right_of(px) -> dict:  # of the held-out images, how many the tower describes in exactly the right words
        with torch.no_grad():
            right = (read(said(px)) == targets[:HELD_OUT]).all(-1)
        return {"numbers": f"{int(right[numbers].sum())}/{int(numbers.sum())}",
                "shapes": f"{int(right[~numbers].sum())}/{int((~numbers).sum())}"}

    measured = {"held_out_right": right_of(pixels_all[:HELD_OUT]), "behind_the_wrong_processor": right_of(wrong)}
    log(f"seer: described right, of images it was not trained on: {json.dumps(measured)}")
    model.save_pretrained(tmp)
    processor.save_pretrained(tmp)
    return {"steps": STEPS, "seed": SEED, **measured}


MADE = Made("smollm2-see", _digest, _train)
build = MADE.build
