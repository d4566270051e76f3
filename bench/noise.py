"""The cleaning filters on a noisy copy of the shipped training corpus: how much of the
injected noise they drop, and how many clean pairs they lose.

The copy (a fixed seed) holds every pair of data/bible-es-en/train and, for each kind of
noise, `--share` / 7 of that many pairs more (20% of the whole at the default 0.25):

- swapped: a real pair with its sides swapped (English where Spanish belongs)
- copy: a real source copied as its target
- language: a real pair with one side in another language (French or German as target,
  Italian or Portuguese as source), made from phrases written for this bench
- misaligned: a real source with the target of another verse
- numbers: a real pair with a verse number in front of each side, the target's different
- boilerplate: web page furniture in both languages (menus, copyright lines, links, markup,
  page numbers), each repeated as a crawl repeats it
- duplicate: a real pair again, later in the corpus

`seq2seq tokenize` (the real pipeline, with the default filters, or the settings `--set`
gives) runs on it; RUN/dropped.tsv.gz says which pair each filter dropped. Printed: per kind,
the pairs injected, dropped and by which filters; the clean pairs lost (and how many of them
were verses the shipped corpus itself repeats, dropped as duplicates); the time the pipeline
took. Misaligned pairs are left to a model's score (`seq2seq score`): no rule sees them.

    PYTHONPATH=. .venv/bin/python bench/noise.py [--share 0.25] [--seed 7] [--keep DIR] [--set data.filters.langid=false]
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import random
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "data" / "bible-es-en"
KINDS = ("swapped", "copy", "language", "misaligned", "numbers", "boilerplate", "duplicate")

PHRASES = {  # subject, verb, object, ending: sentences of another language, in the corpus's register
    "fr": (["Le roi", "Le peuple", "Le prophète", "La femme", "Le fils de David", "Le prêtre", "Le berger"],
           ["a parlé à", "est allé vers", "a vu", "a béni", "a appelé", "a rassemblé", "a suivi"],
           ["ses frères", "la ville sainte", "le temple", "ses serviteurs", "tout le peuple", "les anciens"],
           ["pendant la nuit.", "au matin.", "devant la montagne.", "avec une grande joie.", "selon la parole du Seigneur."]),
    "de": (["Der König", "Das Volk", "Der Prophet", "Die Frau", "Der Sohn Davids", "Der Priester", "Der Hirte"],
           ["sprach zu", "ging zu", "sah", "segnete", "rief", "versammelte", "folgte"],
           ["seinen Brüdern", "der heiligen Stadt", "dem Tempel", "seinen Knechten", "dem ganzen Volk", "den Ältesten"],
           ["in der Nacht.", "am Morgen.", "vor dem Berg.", "mit großer Freude.", "nach dem Wort des Herrn."]),
    "it": (["Il re", "Il popolo", "Il profeta", "La donna", "Il figlio di Davide", "Il sacerdote", "Il pastore"],
           ["parlò a", "andò verso", "vide", "benedisse", "chiamò", "radunò", "seguì"],
           ["i suoi fratelli", "la città santa", "il tempio", "i suoi servi", "tutto il popolo", "gli anziani"],
           ["durante la notte.", "al mattino.", "davanti al monte.", "con grande gioia.", "secondo la parola del Signore."]),
    "pt": (["O rei", "O povo", "O profeta", "A mulher", "O filho de Davi", "O sacerdote", "O pastor"],
           ["falou a", "foi até", "viu", "abençoou", "chamou", "reuniu", "seguiu"],
           ["seus irmãos", "a cidade santa", "o templo", "seus servos", "todo o povo", "os anciãos"],
           ["durante a noite.", "pela manhã.", "diante do monte.", "com grande alegria.", "segundo a palavra do Senhor."]),
}

BOILERPLATE = [
    ("Inicio | Contacto | Aviso legal | Mapa del sitio", "Home | Contact | Legal notice | Site map"),
    ("Copyright © {y} Todos los derechos reservados.", "Copyright © {y2} All rights reserved."),
    ("Haga clic aquí para suscribirse a nuestro boletín.", "Click here to subscribe to our newsletter."),
    ("Visite www.biblia-en-linea.es para más información.", "Visit www.bible-online.com for more information."),
    ("<p>Leer más &raquo;</p>", "<p>Read more &raquo;</p>"),
    ("Página {n} de {m}", "Page {n2} of {m}"),
    ("Escríbanos a contacto@biblia-en-linea.es", "Write to us at contact@bible-online.com"),
    ("Compartir en Facebook | Twitter | WhatsApp", "Share on Facebook | Twitter | WhatsApp"),
]


def sentence(rng: random.Random, lang: str) -> str:
    subject, verb, obj, end = PHRASES[lang]
    return f"{rng.choice(subject)} {rng.choice(verb)} {rng.choice(obj)} {rng.choice(end)}"


def boilerplate(rng: random.Random) -> tuple[str, str]:
    es, en = rng.choice(BOILERPLATE)
    y, n, m = rng.randint(2005, 2024), rng.randint(1, 40), rng.randint(40, 60)
    values = {"y": y, "y2": y if rng.random() < 0.5 else y + 1, "n": n, "n2": n if rng.random() < 0.5 else n + 1, "m": m}
    return es.format(**values), en.format(**values)


def noisy_corpus(es: list[str], en: list[str], share: float, seed: int) -> list[tuple[str, str, str]]:
    """(source, target, kind) for each line of the noisy copy: the clean pairs in order, the
    noise at random places (a duplicate after the pair it repeats); kind "clean" or a KINDS."""
    rng = random.Random(seed)
    n = len(es)
    per_kind = round(share * n / len(KINDS))
    placed: list[tuple[float, str, str, str]] = [(float(i), es[i], en[i], "clean") for i in range(n)]

    def somewhere() -> float:
        return rng.uniform(0, n)

    for _ in range(per_kind):
        i = rng.randrange(n)
        placed.append((somewhere(), en[i], es[i], "swapped"))
        i = rng.randrange(n)
        placed.append((somewhere(), es[i], es[i], "copy"))
        i = rng.randrange(n)
        lang = rng.choice(list(PHRASES))
        pair = (es[i], sentence(rng, lang)) if lang in ("fr", "de") else (sentence(rng, lang), en[i])
        placed.append((somewhere(), *pair, "language"))
        i, j = rng.randrange(n), rng.randrange(n)
        placed.append((somewhere(), es[i], en[j if j != i else (j + 1) % n], "misaligned"))
        i = rng.randrange(n)
        number = rng.randint(1, 176)
        placed.append((somewhere(), f"{number} {es[i]}", f"{number + rng.randint(1, 9)} {en[i]}", "numbers"))
        placed.append((somewhere(), *boilerplate(rng), "boilerplate"))
        i = rng.randrange(n)
        placed.append((rng.uniform(i + 0.5, n), es[i], en[i], "duplicate"))
    placed.sort(key=lambda row: row[0])
    return [(s, t, kind) for _, s, t, kind in placed]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--share", type=float, default=0.25, help="noise pairs per clean pair (0.25: 20%% of the whole)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", type=Path, help="write the corpus and the run here (default: a temporary directory)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="a config override, as seq2seq --set")
    args = parser.parse_args()

    from seq2seq_cli.config_load import load_config
    from seq2seq_cli.run.tokenizing import train_tokenizer

    es = (SHIPPED / "train.es").read_text(encoding="utf-8").splitlines()
    en = (SHIPPED / "train.en").read_text(encoding="utf-8").splitlines()
    rows = noisy_corpus(es, en, args.share, args.seed)
    repeated = {pair for pair, count in collections.Counter(zip(es, en)).items() if count > 1}
    with tempfile.TemporaryDirectory() as scratch:
        out = args.keep or Path(scratch)
        out.mkdir(parents=True, exist_ok=True)
        (out / "noisy.tsv").write_text("".join(f"{s}\t{t}\n" for s, t, _ in rows), encoding="utf-8")
        (out / "noisy.kinds").write_text("".join(f"{kind}\n" for _, _, kind in rows), encoding="utf-8")
        raw = yaml.safe_load((REPO / "configs" / "quickstart.yaml").read_text(encoding="utf-8"))
        raw.update(name="noise", run_dir=str(out / "run"))
        raw["data"].update(train=str(out / "noisy.tsv"), valid=str(SHIPPED / "valid"), test=None)
        (out / "noise.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
        config = load_config(out / "noise.yaml", args.overrides)
        start = time.perf_counter()
        train_tokenizer(config)
        seconds = time.perf_counter() - start
        with gzip.open(out / "run" / "dropped.tsv.gz", "rt", encoding="utf-8") as f:
            dropped = {int(line.split("\t")[1]) - 1: line.split("\t")[2] for line in f.read().splitlines()[1:]}
        report = json.loads((out / "run" / "data_report.json").read_text(encoding="utf-8"))

    print(f"{len(rows):,} pairs: {len(es):,} clean and {len(rows) - len(es):,} noise "
          f"({100 * (len(rows) - len(es)) / len(rows):.1f}%); filters on: {', '.join(report['filters']['on'])}")
    print(f"{'kind':<12}{'pairs':>8}{'dropped':>9}{'share':>8}  by")
    totals = collections.Counter()
    for kind in ("clean", *KINDS):
        mine = [i for i, row in enumerate(rows) if row[2] == kind]
        gone = [i for i in mine if i in dropped]
        by = collections.Counter(dropped[i] for i in gone)
        totals[kind] = len(gone)
        print(f"{kind:<12}{len(mine):>8,}{len(gone):>9,}{100 * len(gone) / len(mine):>7.1f}%  "
              + ", ".join(f"{k} {v}" for k, v in by.most_common()))
    clean = [i for i, row in enumerate(rows) if row[2] == "clean"]
    own_repeats = sum(1 for i in clean if dropped.get(i) == "duplicate" and (rows[i][0], rows[i][1]) in repeated)
    noise_all = sum(totals[k] for k in KINDS) / sum(1 for row in rows if row[2] != "clean")
    rule_kinds = [k for k in KINDS if k != "misaligned"]
    rule = sum(totals[k] for k in rule_kinds) / sum(1 for row in rows if row[2] in rule_kinds)
    print(f"noise dropped: {100 * rule:.1f}% of the kinds rules can see (all but misaligned), {100 * noise_all:.1f}% of all")
    print(f"clean pairs lost: {100 * totals['clean'] / len(clean):.2f}% ({totals['clean']:,}); of them {own_repeats:,} are "
          f"verses the shipped corpus itself repeats, dropped as duplicates "
          f"({100 * (totals['clean'] - own_repeats) / len(clean):.2f}% without them)")
    print(f"tokenize (SentencePiece, encoding, filters, report): {seconds:.0f} s")


if __name__ == "__main__":
    main()
