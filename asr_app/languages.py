"""Whisper's languages (code -> name), in the order of its language tokens. A copy of the table every
multilingual Whisper tokenizer carries, here so that command-line options are checked before torch and
transformers load (tests/test_models_cli.py checks it against transformers' own)."""

from __future__ import annotations

# code name, one language a line, in the order of Whisper's language tokens
_TABLE = """
en english
zh chinese
de german
es spanish
ru russian
ko korean
fr french
ja japanese
pt portuguese
tr turkish
pl polish
ca catalan
nl dutch
ar arabic
sv swedish
it italian
id indonesian
hi hindi
fi finnish
vi vietnamese
he hebrew
uk ukrainian
el greek
ms malay
cs czech
ro romanian
da danish
hu hungarian
ta tamil
no norwegian
th thai
ur urdu
hr croatian
bg bulgarian
lt lithuanian
la latin
mi maori
ml malayalam
cy welsh
sk slovak
te telugu
fa persian
lv latvian
bn bengali
sr serbian
az azerbaijani
sl slovenian
kn kannada
et estonian
mk macedonian
br breton
eu basque
is icelandic
hy armenian
ne nepali
mn mongolian
bs bosnian
kk kazakh
sq albanian
sw swahili
gl galician
mr marathi
pa punjabi
si sinhala
km khmer
sn shona
yo yoruba
so somali
af afrikaans
oc occitan
ka georgian
be belarusian
tg tajik
sd sindhi
gu gujarati
am amharic
yi yiddish
lo lao
uz uzbek
fo faroese
ht haitian creole
ps pashto
tk turkmen
nn nynorsk
mt maltese
sa sanskrit
lb luxembourgish
my myanmar
bo tibetan
tl tagalog
mg malagasy
as assamese
tt tatar
haw hawaiian
ln lingala
ha hausa
ba bashkir
jw javanese
su sundanese
yue cantonese
"""
LANGUAGES: dict[str, str] = dict(line.split(" ", 1) for line in _TABLE.strip().splitlines())
NAME_TO_CODE = {name: code for code, name in LANGUAGES.items()}


def language_code(value: str) -> str:
    """'fr', 'French' or '<|fr|>' -> 'fr'; ValueError for anything Whisper does not know."""
    key = value.strip().lower().removeprefix("<|").removesuffix("|>")
    if key in LANGUAGES:
        return key
    if key in NAME_TO_CODE:
        return NAME_TO_CODE[key]
    raise ValueError(f"unknown language '{value}'; Whisper knows: {', '.join(LANGUAGES)}")
