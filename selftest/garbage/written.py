"""Answers written for the corpus by the project, not by a model: clean answers of the shapes the real model never
gives (other scripts asked for, code, tables, terse replies, text that looks like garbage and is not), and garbage of
the kinds the real engine cannot be made to print here (a broken MoE kernel's noise, SentencePiece markers, salad of
real words). Every row is (kind, variant, prompt, text); the variants are named "written: ..." wherever they appear.
"""

from __future__ import annotations

# ---- clean: the human side of the corpus -----------------------------------------------------------------------

SCRIPTS_ASKED_FOR = (
    ("Translate 'Where is the train station?' into Japanese.", "駅はどこですか？ (Eki wa doko desu ka?)"),
    ("How do you say 'thank you' in Hebrew?",
     "In Hebrew, thank you is תודה (toda). To say thank you very much, use תודה רבה (toda raba)."),
    ("Translate 'Good morning, how are you?' into Russian.", "Доброе утро! Как у вас дела?"),
    ("How do I write 'welcome' in Arabic?",
     "The usual word is أهلاً وسهلاً (ahlan wa sahlan); a shop sign often says مرحباً (marhaban)."),
    ("What is 'I like reading books' in Chinese?", "我喜欢看书。(Wǒ xǐhuan kàn shū.)"),
    ("Translate 'See you tomorrow' into Korean, casual and polite.",
     "Casual: 내일 봐! Polite: 내일 봬요. Very formal: 내일 뵙겠습니다."),
    ("Translate 'The sea is calm today' into Greek.", "Η θάλασσα είναι ήρεμη σήμερα."),
    ("Answer in Hindi: what is the capital of India?", "भारत की राजधानी नई दिल्ली है।"),
    ("How do you write 'water' in Thai and in Georgian?", "Thai: น้ำ (nam). Georgian: წყალი (ts'q'ali)."),
    ("What is the Ukrainian word for peace, and the Persian one?", "Ukrainian: мир (myr). Persian: صلح (solh)."),
    ("Write the word 'mountain' in katakana and in kanji.", "Katakana: マウンテン. Kanji: 山 (yama)."),
    ("Give me a polite greeting in Armenian.", "Բարև Ձեզ (Barev dzez): a polite hello."),
    ("Please reply only in Japanese: what colour is the sky?", "空は青いです。晴れた日には特にきれいに見えます。"),
    ("Translate this sentence into Finnish: 'The weather is lovely today, so we are walking to the lake after lunch.'",
     "Tänään on ihana sää, joten kävelemme lounaan jälkeen järvelle."),
    ("Write a few sentences in Latin about a farmer and his fields.",
     "Agricola in agro suo laborat et frumentum magna cura colit. Vesperi ad casam redit, ubi uxor et liberi eum "
     "cum gaudio exspectant. Hieme boves in stabulo manent, agricola arma reficit, filii ligna portant; vere "
     "omnes rursus agros arant et semina spargunt."),
    ("I need placeholder text for a web page mock-up, about forty words.",
     "Lorem ipsum dolor sit amet, consectetur adipiscing elit. Integer nec odio praesent libero, sed cursus ante "
     "dapibus diam. Sed nisi nulla quis sem at nibh elementum imperdiet. Duis sagittis ipsum praesent mauris, "
     "fusce nec tellus sed augue semper porta mauris massa."),
    ("Translate into Czech: 'Where can I buy a ticket for the night train?'",
     "Kde si mohu koupit jízdenku na noční vlak?"),
    ("Translate into Vietnamese: 'My grandmother cooks the best soup in the whole village.'",
     "Bà tôi nấu món canh ngon nhất cả làng."),
    ("你能用中文简单介绍一下长城吗？", "长城是中国古代修建的防御工程，总长度超过两万公里，是世界上最著名的建筑之一。"),
    ("Кто написал роман «Война и мир»?", "Роман «Война и мир» написал Лев Толстой."),
)

CODE = (
    ("Write a shell command that prints only the error lines of a log file, with their numbers.",
     "grep -n -i 'error' app.log 2>&1 | grep -v '^#' || echo 'no errors found'"),
    ("Give me a regular expression for a simple email address.",
     "^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\\.[A-Za-z]{2,}$\n\nIt accepts most everyday addresses; it is not a full "
     "RFC 5322 parser."),
    ("Return the settings as JSON.",
     '{"server": {"listen": [{"host": "127.0.0.1", "ports": [8000, 8001]}], "limits": {"body": {"max_mb": 32}}}, '
     '"tags": [[["a"]], [["b"]]]}'),
    ("Return an empty row of the sheet as a JSON array of eleven strings.",
     '["", "", "", "", "", "", "", "", "", "", ""]'),
    ("How do I negate a value twice in C to get 0 or 1?",
     "Use the double negation: `int flag = !!value;` gives 1 for any non-zero value and 0 otherwise. In a "
     "condition, `if (!(a && b) || !c)` reads the same way."),
    ("Show me the start of a bash script that stops on errors.",
     "#!/usr/bin/env bash\nset -euo pipefail\ntrap 'echo \"failed at line $LINENO\" >&2' ERR\n"
     "for f in \"$@\"; do [[ -f $f ]] || { echo \"missing: $f\" >&2; exit 1; }; done"),
    ("Write the sum of the first n integers in LaTeX.", "$$\\sum_{i=1}^{n} i = \\frac{n(n+1)}{2}$$"),
    ("What does this diff change?",
     "--- a/app.py\n+++ b/app.py\n@@ -1,3 +1,4 @@\n import os\n+import sys\n def main():\n-    pass\n+    return 0\n\n"
     "It imports sys and makes main return 0 instead of doing nothing."),
    ("How does a merge conflict look in a file?",
     "<<<<<<< HEAD\ntimeout = 30\n=======\ntimeout = 60\n>>>>>>> feature/longer-timeout\n\nKeep one of the two "
     "values, delete the three marker lines, then commit."),
    ("Draw the layout of a small Python project.",
     "myproject/\n├── pyproject.toml\n├── README.md\n├── src/\n│   └── myproject/\n│       ├── __init__.py\n"
     "│       └── cli.py\n└── tests/\n    └── test_cli.py"),
    ("Show a plain-text table of three servers and their load.",
     "+---------+------+-------+\n| server  | cpus | load  |\n+=========+======+=======+\n| alpha   |    8 |  0.42 "
     "|\n+---------+------+-------+\n| beta    |   16 |  1.37 |\n+---------+------+-------+"),
    ("Write a CSS rule that centres a box.",
     ".box {\n  display: grid;\n  place-items: center;\n  min-height: 100vh;\n}\n/* ---------- end ---------- */"),
    ("In Perl, how do I strip trailing whitespace from every line?",
     "perl -pi -e 's/\\s+$//' notes.txt edits the file in place; inside a script, write $line =~ s/\\s+$//;"),
    ("Give me a C++ comment banner for a section.",
     "//////////////////////////////////////////\n// Networking: sockets and retries\n"
     "//////////////////////////////////////////"),
    ("Write a Python decorator that times a function.",
     "import functools, time\n\ndef timed(fn):\n    @functools.wraps(fn)\n    def wrapper(*args, **kwargs):\n"
     "        start = time.perf_counter()\n        try:\n            return fn(*args, **kwargs)\n        finally:\n"
     "            print(f'{fn.__name__}: {time.perf_counter() - start:.3f}s')\n    return wrapper"),
    ("What did Python print?",
     "Traceback (most recent call last):\n  File \"main.py\", line 3, in <module>\n    print(total / count)\n"
     "          ~~~~~~^~~~~~~\nZeroDivisionError: division by zero"),
)

TABLES = (
    ("Compare three fruits in a table.",
     "| fruit | colour | taste | season |\n|:------|:------:|------:|:-------|\n| apple | red | sweet | autumn |\n"
     "| lemon | yellow | sour | winter |\n| plum | purple | tart | summer |"),
    ("Make a table of the planets closest to the sun.",
     "| # | planet | moons |\n| ---: | --- | ---: |\n| 1 | Mercury | 0 |\n| 2 | Venus | 0 |\n| 3 | Earth | 1 |\n"
     "| 4 | Mars | 2 |"),
    ("Summarise the release as a table.",
     "Release 2.4\n===========\n\n| area | change |\n|---|---|\n| startup | faster cold start |\n"
     "| memory | lower peak usage |\n| errors | clearer messages |\n| plugins | new loading system |"),
    ("Give me a glossary of five networking terms.",
     "Latency\n: time from request to first byte\n\nThroughput\n: data moved per second\n\nJitter\n: variation in "
     "latency\n\nPacket loss\n: share of packets dropped\n\nBandwidth\n: maximum link capacity"),
)

TERSE = (
    ("Reply with OK.", "OK"), ("Did it work?", "Yes!!!"), ("Is the build green?", "No."), ("Anything else?", "Nope!"),
    ("Thoughts?", "Wow!!!"), ("Say something short.", "Hmm..."), ("React to the news.", "Great, thanks!!"),
    ("Confirm.", "Sure :)"), ("Answer with a thumbs up.", "👍"), ("What is 6 times 7?", "42"),
    ("Which value is missing?", "N/A"), ("Reply with a dash if nothing.", "—"), ("Summarise.", "TL;DR: yes, ship it."),
    ("Ask me a question back.", "Why?!"), ("Rate the film.", "★★★★☆ (4 out of 5)"),
)

LOOK_ALIKES = (
    ("Write a table of contents line.", "Chapter 1: Getting started ............................ 5"),
    ("React with surprise.", "Wait... what?! You finished the whole thing already?!"),
    ("Write a short scene break in a story.", "She closed the door behind her.\n\n* * *\n\nMorning came slowly."),
    ("Show a progress bar for 80%.", "Progress: ████████░░ 80%"),
    ("Wish me happy birthday.", "Happy birthday! 🎉🎂🎈🎁🥳 I hope the year ahead is a great one."),
    ("How does GPT-2's tokenizer mark a space?",
     "Byte-level BPE maps every byte to a printable character, so a leading space becomes Ġ and a newline becomes "
     "Ċ: the word ' hello' is stored as one token, Ġhello. The decoder maps them back, so you never see them in "
     "normal output."),
    ("What is the ▁ character in SentencePiece?",
     "SentencePiece writes a space as ▁ (U+2581), so 'new york' can become the pieces ▁new and ▁york; "
     "detokenizing turns each ▁ back into a space."),
    ("Who was Ġorġ Borg Olivier?",
     "Ġorġ Borg Olivier was a Maltese statesman who led Malta to independence in 1964; Maltese writes the letters "
     "ġ and ċ with a dot above."),
    ("Write an underlined heading in plain text.", "Results\n~~~~~~~\n\nAll tests passed."),
    ("Write an emphatic but polite reminder.", "Reminder: the deadline is TODAY!! Please submit before 5 pm."),
    ("What are the new features?",
     "- Faster cold start times\n- Lower memory usage overall\n- Clearer error messages everywhere\n"
     "- New plugin loading system\n- Better GPU kernel selection"),
    ("List some good keywords for a post about Python packaging.",
     "python, packaging, pyproject, wheels, sdist, setuptools, hatch, poetry, versioning, dependencies, "
     "virtualenv, pip, publishing, PyPI"),
    ("Give me a shopping list for pancakes.", "Flour\nMilk\nEggs\nButter\nSugar\nBaking powder\nSalt\nMaple syrup"),
    ("Describe the product in a spec sheet style.",
     "Compact aluminium body. Twelve-hour battery life. Dual-band wireless networking. Backlit keyboard with "
     "adjustable brightness. Fast charging via USB-C. Two-year limited warranty."),
    ("Cite the paper in APA style.",
     "Nguyen, T., & Okafor, C. (2021). Adaptive batching for low-latency inference servers. Journal of Systems "
     "Research, 14(2), 101–118."),
)

PROSE = (
    ("Explain what a reverse proxy does.",
     "A reverse proxy sits in front of one or more servers and receives the requests that clients send to them. "
     "It can spread the load across several machines, cache answers that do not change, and end TLS so that the "
     "servers behind it only ever speak plain HTTP."),
    ("Describe the GB10's memory in one paragraph.",
     "Unified LPDDR5X memory shared between CPU and GPU gives large models room without PCIe copies; bandwidth, "
     "not compute, then bounds single-stream decode speed on dense checkpoints."),
)

# ---- garbage the real engine cannot be made to print here ---------------------------------------------------

PUNCTUATION_NOISE = (
    # what the GB10s with a broken MoE kernel answered (NVIDIA/cutlass#3227), as long as an 80-token answer
    ("What is the capital of France?", "!" * 80),
    ("Explain why the sky is blue in two sentences.", "The sky!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"),
    ("Write a haiku about autumn.", "?" * 40),
    ("List three fruits, one per line.", ",,,,,,,,,,,,,,,,,,,,,,,,"),
    ("Say hello.", "!\n!\n!\n!\n!\n!\n!\n!\n!\n!\n!\n!"),
    ("Describe a cat to a child.", "! ! ! ! ! ! ! ! ! ! ! ! ! ! ! ! ! !"),
    # Unicode noise: a handful of symbols, none a rule, a table or a bar
    ("What does a compiler do?", "⁇⁇⁇⁇⁇⁇⁇⁇⁇⁇⁇⁇⁇⁇⁇⁇"),
    ("How do birds fly?", "¿¡¿¡¿¡§¶§¶§¶¤¤¤¤¿¡"),
    ("What is Git used for?", "A version control ◊◊◊※※※◊◊◊※※※◊◊◊"),
)

BPE_MARKERS = (
    # SentencePiece's ▁ left in (a Llama 2 or Gemma tokenizer without its decoder)
    ("Explain why the sky is blue in two sentences.",
     "▁The▁sky▁looks▁blue▁because▁air▁scatters▁short▁blue▁wavelengths▁more▁than▁red▁ones."),
    ("What is photosynthesis?", "▁Photo synthesis ▁is ▁how ▁plants ▁turn ▁light ▁into ▁sugar ."),
    # byte-level BPE's markers glued, the spaces gone
    ("Write a Python function that adds two numbers.",
     "Sure!ĊĊHereĠisĠaĠfunction:ĊĊ```pythonĊdefĠadd(a,Ġb):ĊĠĠĠĠreturnĠaĠ+Ġb"),
)

WORD_SALAD = (
    # real words in no grammatical order (no function words): caught as word salad
    ("Explain what an API is to a beginner.",
     "window seventeen quietly elephant distribute bright kitchen however orange sleeping governments purple "
     "mountain carefully ancient river telephone yesterday happily engine green"),
    ("What causes earthquakes?",
     "Successful interstate Mahatma foreign secret power people following others Castle arbitrary Famous "
     "Pharmacy overall friend mentor dependable glue Friendly eight"),
    # Latin-like salad to a request that asked for no Latin
    ("How do vaccines work, briefly?",
     "Vestibulum tempor luctus posuere cubilia curae aenean tellus mauris pharetra quis lacinia nunc egestas "
     "pellentesque habitant morbi tristique senectus netus malesuada fames turpis"),
    # function words drawn as often as content words, in no order: NOT caught (see docs/GARBAGE.md)
    ("Describe the water cycle.",
     "the of river and to a cloud is in the rain that for it on falls with as the sea was by be are at from "
     "the vapour this or an"),
)

SCRIPT_NOT_ASKED_FOR = (
    # a script other than the one asked for is still foreign
    ("Translate 'thank you' into Japanese.", "ありがとう שלום ありがとうございます"),
    ("How do you say hello in Korean?", "안녕하세요 压力优化 안녕"),
    ("Translate 'good night' into Spanish.", "Buenas noches. Спокойной ночи."),
)

ROWS: list[tuple[str, str, str, str]] = [
    *(("human", "written: scripts asked for", p, t) for p, t in SCRIPTS_ASKED_FOR),
    *(("human", "written: code", p, t) for p, t in CODE),
    *(("human", "written: tables", p, t) for p, t in TABLES),
    *(("human", "written: terse", p, t) for p, t in TERSE),
    *(("human", "written: look-alikes", p, t) for p, t in LOOK_ALIKES),
    *(("human", "written: prose", p, t) for p, t in PROSE),
    *(("written", "written: punctuation noise", p, t) for p, t in PUNCTUATION_NOISE),
    *(("written", "written: BPE markers", p, t) for p, t in BPE_MARKERS),
    *(("written", "written: word salad", p, t) for p, t in WORD_SALAD),
    *(("written", "written: script not asked for", p, t) for p, t in SCRIPT_NOT_ASKED_FOR),
]
