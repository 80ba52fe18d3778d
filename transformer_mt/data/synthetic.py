"""A deterministic synthetic language pair, so the offline demo can train and score in minutes.

Real corpora need downloads and hours of training. Here the gold translation is a
pure function of the source (so a small model can reach BLEU >= 90 on CPU), yet it
is neither a copy nor a reversal: a model must learn a lexicon, reordering and agreement.

Source ("English"): SVO, ``Det Adj* Noun Verb Det Adj* Noun (Prep Det Adj* Noun)* [Adverb]``
with 0-2 adjectives per noun phrase, 0-2 prepositional phrases, 5-20 words.
Nouns have singular/plural forms, determiners mark number (a/an/some, this/these,
that/those; the/my/your are neutral), verbs have 3sg present, plural present and past.

Target: made-up words drawn from CV syllables with a seeded RNG (never equal to a
source word). Word order is SOV with postpositions: subject NP, object NP, each
``NP Postp``, the adverb, then the verb. Inside an NP: ``Det Noun Adj*``. Every
noun has one of 3 arbitrary genders; determiners inflect for case (subject,
object, oblique), gender and number (stem + r/m/d + o/a/e + optional n);
adjectives agree too, with German-like syncretism (the oblique case loses gender)
to keep the vocabulary under 1000 forms; the verb agrees with the subject's
number and tense, which English does not show in the past. Example (seed 0):

  the old dog watched these big red apples in a garden quickly
  -> mero furu sekaniko bemon bison bofopakon rutemekon lede fuge soga zodoso fureloli
     (the dog old | these.OBJ apples big.OBJ red.OBJ | a.OBL garden in | quickly | watched.PAST.SG)
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

SUBJECT, OBJECT, OBLIQUE = 0, 1, 2  # target case of a noun phrase
SINGULAR, PLURAL = 0, 1
PRESENT, PAST = 0, 1

# Regular English words only, and no word in two categories (e.g. no noun "watch").
NOUNS = """cat dog bird horse cow fox bear rabbit duck goat lion tiger monkey donkey teacher
doctor farmer student king queen baker painter sailor soldier singer driver nurse pilot artist
friend neighbor girl boy brother sister uncle aunt baby city house garden table chair book letter
box bus car boat ship train bridge river mountain forest village castle tower window door key cup
bottle apple banana cake flower tree stone ball hat coat shoe bag lamp clock picture church road
island""".split()
ADJECTIVES = """big small old young red blue green black white happy sad quiet loud tall short
strong weak clever lazy brave angry kind rich poor warm cold bright dark dirty heavy strange
famous gentle hungry noisy proud shy tiny wild busy""".split()
VERBS = """like love hate want need watch visit follow help push pull kick touch paint wash cook
open climb carry call greet thank remember collect deliver discover enjoy fear fix guard hunt lift
miss observe own pick praise protect reach repair respect save search trust warn borrow chase
admire notice ignore""".split()
PREPOSITIONS = "in on with near under behind beside without from for".split()
ADVERBS = """quickly slowly quietly loudly gently carefully happily sadly often rarely always again
together badly early proudly eagerly secretly boldly politely""".split()
# (singular, plural) surface forms of each source determiner; "a" becomes "an" before a vowel.
DETERMINERS = (
  ("the", "the"),
  ("a", "some"),
  ("this", "these"),
  ("that", "those"),
  ("my", "my"),
  ("your", "your"),
)

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_DRAWS = 32  # uniforms consumed per sentence: enough for the longest one (31)
_CELLS = [(c, g, n) for c in range(3) for g in range(3) for n in range(2)]  # case, gender, number


def _english(word: str, suffix: str) -> str:
  """Regular spelling of word + "s" (plural, 3rd person singular) or word + "ed" (past)."""
  if word.endswith("y") and word[-2] not in _VOWELS:
    return word[:-1] + "i" + ("es" if suffix == "s" else "ed")
  if suffix == "s":
    return word + ("es" if word.endswith(("s", "sh", "ch", "x", "z")) else "s")
  return word + ("d" if word.endswith("e") else "ed")


def determiner_form(stem: str, case: int, gender: int, number: int) -> str:
  """All 18 case x gender x number cells are distinct: e.g. ti -> tiro, timan, tiden."""
  return stem + "rmd"[case] + "oae"[gender] + ("n" if number == PLURAL else "")


def adjective_form(stem: str, case: int, gender: int, number: int) -> str:
  """11 distinct endings: the oblique case drops gender, the object case marks only the singular."""
  if case == OBLIQUE:
    return stem + ("di" if number == SINGULAR else "din")
  ending = ("ko", "la", "ve")[gender]
  if number == PLURAL:
    return stem + ending + "n"
  return stem + ending + ("m" if case == OBJECT else "")


def target_verb_form(stem: str, tense: int, number: int) -> str:
  return stem + ("ru", "li")[tense] + ("n" if number == PLURAL else "")


def _target_forms(kind: str, stem: str) -> list[str]:
  """Every surface form of one target lemma (nouns add -n in the plural)."""
  if kind == "noun":
    return [stem, stem + "n"]
  if kind == "verb":
    return [target_verb_form(stem, t, n) for t in range(2) for n in range(2)]
  if kind in ("adj", "det"):
    return [(adjective_form if kind == "adj" else determiner_form)(stem, *c) for c in _CELLS]
  return [stem]


@dataclasses.dataclass(frozen=True)
class LanguagePair:
  """Both lexicons, indexed by lemma; target words are stems inflected by the functions above."""

  source_nouns: tuple[tuple[str, str], ...]  # (singular, plural)
  source_verbs: tuple[tuple[str, str, str], ...]  # (3sg present, plural present, past)
  source_adjectives: tuple[str, ...]
  source_prepositions: tuple[str, ...]
  source_adverbs: tuple[str, ...]
  source_determiners: tuple[tuple[str, str], ...]  # (singular, plural)
  target_nouns: tuple[tuple[str, str], ...]  # (singular, plural)
  noun_genders: tuple[int, ...]  # 0, 1 or 2 per noun
  target_verbs: tuple[str, ...]  # stems
  target_adjectives: tuple[str, ...]  # stems
  target_postpositions: tuple[str, ...]
  target_adverbs: tuple[str, ...]
  target_determiners: tuple[str, ...]  # stems

  @functools.cached_property
  def _source_lexicon(self) -> dict[str, tuple[str, int, int | None]]:
    """Surface word -> (category, lemma index, feature): the parser's only lookup table."""
    lex = {}
    for i, forms in enumerate(self.source_nouns):
      lex.update({w: ("noun", i, n) for n, w in enumerate(forms)})
    for i, forms in enumerate(self.source_verbs):
      lex.update({w: ("verb", i, f) for f, w in enumerate(forms)})
    for i, (sg, pl) in enumerate(self.source_determiners):
      lex.update(
        {sg: ("det", i, SINGULAR), pl: ("det", i, PLURAL)} if sg != pl else {sg: ("det", i, None)}
      )
    lex["an"] = lex["a"]
    for cat, words in (
      ("adj", self.source_adjectives),
      ("prep", self.source_prepositions),
      ("adv", self.source_adverbs),
    ):
      lex.update({w: (cat, i, None) for i, w in enumerate(words)})
    return lex

  @functools.cached_property
  def source_vocabulary(self) -> tuple[str, ...]:
    """Every source surface form, sorted."""
    return tuple(sorted(self._source_lexicon))

  @functools.cached_property
  def target_vocabulary(self) -> tuple[str, ...]:
    """Every target surface form, sorted."""
    lemmas = (
      ("noun", [sg for sg, _ in self.target_nouns]),
      ("verb", self.target_verbs),
      ("adj", self.target_adjectives),
      ("det", self.target_determiners),
      ("", self.target_postpositions + self.target_adverbs),
    )
    return tuple(
      sorted({w for kind, stems in lemmas for s in stems for w in _target_forms(kind, s)})
    )

  # A clause is (subject NP, verb, tense, object NP, ((prep, NP), ...), adverb or None),
  # an NP is (determiner, number, noun, (adjective, ...)); all entries are lemma indices.

  def _sample_clause(self, u):
    """Builds a clause from an iterator of uniforms (one rng call per sentence keeps this fast)."""
    pick = lambda n: int(next(u) * n)  # noqa: E731

    def noun_phrase():
      det, number, noun = pick(len(DETERMINERS)), pick(2), pick(len(self.source_nouns))
      p, k = next(u), len(self.source_adjectives)
      first, second = pick(k), pick(k - 1)  # two distinct adjectives
      adjs = () if p < 0.5 else (first,) if p < 0.85 else (first, second + (second >= first))
      return det, number, noun, adjs

    subject, verb, tense, obj = noun_phrase(), pick(len(self.source_verbs)), pick(2), noun_phrase()
    p = next(u)
    pps = tuple(
      (pick(len(self.source_prepositions)), noun_phrase())
      for _ in range(0 if p < 0.45 else 1 if p < 0.8 else 2)
    )
    adverb = pick(len(self.source_adverbs)) if next(u) < 0.4 else None
    return subject, verb, tense, obj, pps, adverb

  def _source_words(self, clause) -> list[str]:
    subject, verb, tense, obj, pps, adverb = clause

    def noun_phrase(np_):
      det, number, noun, adjs = np_
      words = [self.source_adjectives[a] for a in adjs] + [self.source_nouns[noun][number]]
      d = self.source_determiners[det][number]
      return ["an" if d == "a" and words[0][0] in _VOWELS else d] + words

    words = noun_phrase(subject) + [self.source_verbs[verb][subject[1] if tense == PRESENT else 2]]
    words += noun_phrase(obj)
    for prep, np_ in pps:
      words += [self.source_prepositions[prep]] + noun_phrase(np_)
    return words + ([self.source_adverbs[adverb]] if adverb is not None else [])

  def _target_words(self, clause) -> list[str]:
    subject, verb, tense, obj, pps, adverb = clause

    def noun_phrase(np_, case):
      det, number, noun, adjs = np_
      gender = self.noun_genders[noun]
      return [
        determiner_form(self.target_determiners[det], case, gender, number),
        self.target_nouns[noun][number],
      ] + [adjective_form(self.target_adjectives[a], case, gender, number) for a in adjs]

    words = noun_phrase(subject, SUBJECT) + noun_phrase(obj, OBJECT)
    for prep, np_ in pps:
      words += noun_phrase(np_, OBLIQUE) + [self.target_postpositions[prep]]
    if adverb is not None:
      words.append(self.target_adverbs[adverb])
    return words + [target_verb_form(self.target_verbs[verb], tense, subject[1])]

  def _parse(self, sentence: str):
    """Recursive descent over the source grammar, checking number agreement and a/an."""
    words = sentence.split()
    i = 0

    def fail(why: str):
      raise ValueError(f"not a sentence of the synthetic source grammar ({why}): {sentence!r}")

    def take(category: str, optional: bool = False):
      """The (lemma, feature) of words[i] if it is a `category`, else None or an error."""
      nonlocal i
      entry = self._source_lexicon.get(words[i], ("unknown word",)) if i < len(words) else ("end",)
      if entry[0] == category:
        i += 1
        return entry[1:]
      if not optional:
        fail(
          f"expected {category} at word {i}, found "
          + (f"{words[i]!r} ({entry[0]})" if i < len(words) else "the end")
        )
      return None

    def noun_phrase():
      start = i
      det, det_number = take("det")
      adjs = []
      while (adj := take("adj", optional=True)) is not None:
        adjs.append(adj[0])
      noun, number = take("noun")
      if len(adjs) > 2:
        fail("more than two adjectives")
      if det_number is not None and det_number != number:
        fail(f"{words[start]!r} does not agree in number with {words[i - 1]!r}")
      if words[start] in ("a", "an") and words[start] != (
        "an" if words[start + 1][0] in _VOWELS else "a"
      ):
        fail(f"wrong article {words[start]!r}")
      return det, number, noun, tuple(adjs)

    subject = noun_phrase()
    verb, form = take("verb")
    if form != 2 and form != subject[1]:
      fail(f"verb {words[i - 1]!r} does not agree with the subject")
    obj, pps = noun_phrase(), []
    while (prep := take("prep", optional=True)) is not None:
      pps.append((prep[0], noun_phrase()))
    if len(pps) > 2:
      fail("more than two prepositional phrases")
    adverb = take("adv", optional=True)
    take("end")
    return subject, verb, PAST if form == 2 else PRESENT, obj, tuple(pps), adverb and adverb[0]

  def sample_source(self, rng: np.random.Generator) -> str:
    return " ".join(self._source_words(self._sample_clause(iter(rng.random(_DRAWS).tolist()))))

  def translate(self, source: str) -> str:
    """The gold translation; raises ValueError for a sentence outside the source grammar."""
    return " ".join(self._target_words(self._parse(source)))


@functools.lru_cache(maxsize=8)
def make_language_pair(seed: int) -> LanguagePair:
  """The English lexicon is fixed; the seed draws the target words and the noun genders."""
  rng = np.random.default_rng(seed)
  source_nouns = tuple((w, _english(w, "s")) for w in NOUNS)
  source_verbs = tuple((_english(w, "s"), w, _english(w, "ed")) for w in VERBS)
  # Every target surface form is unique and no target form is a source word, so a
  # target word identifies its lemma and features, and copying the source never helps.
  taken = {w for forms in source_nouns + source_verbs + DETERMINERS for w in forms}
  taken.update(ADJECTIVES + PREPOSITIONS + ADVERBS + ["an"])

  def fresh(kind: str, count: int, min_syllables: int, max_syllables: int) -> tuple[str, ...]:
    stems = []
    while len(stems) < count:
      syllables = rng.integers(min_syllables, max_syllables + 1)
      stem = "".join(
        _CONSONANTS[rng.integers(len(_CONSONANTS))] + _VOWELS[rng.integers(5)]
        for _ in range(syllables)
      )
      words = {stem, *_target_forms(kind, stem)}
      if not words & taken:
        taken.update(words)
        stems.append(stem)
    return tuple(stems)

  nouns = fresh("noun", len(NOUNS), 2, 3)
  return LanguagePair(
    source_nouns=source_nouns,
    source_verbs=source_verbs,
    source_adjectives=tuple(ADJECTIVES),
    source_prepositions=tuple(PREPOSITIONS),
    source_adverbs=tuple(ADVERBS),
    source_determiners=DETERMINERS,
    target_nouns=tuple(tuple(_target_forms("noun", s)) for s in nouns),
    noun_genders=tuple(int(g) for g in rng.permutation(np.arange(len(NOUNS)) % 3)),
    target_verbs=fresh("verb", len(VERBS), 2, 3),
    target_adjectives=fresh("adj", len(ADJECTIVES), 2, 3),
    target_postpositions=fresh("", len(PREPOSITIONS), 1, 2),
    target_adverbs=fresh("", len(ADVERBS), 2, 3),
    target_determiners=fresh("det", len(DETERMINERS), 1, 1),
  )


def generate_splits(
  num_train: int, num_eval: int, seed: int, num_validation: int = 0
) -> dict[str, list[tuple[str, str]]]:
  """{"train", "test"[, "validation"]} (source, target) pairs of make_language_pair(seed).

  Test and validation sources are distinct and never seen in training. Test is drawn
  first and validation from a stream of its own, so neither depends on num_train and
  asking for validation leaves the test set unchanged. Training pairs may repeat (as
  in real data).
  """
  pair = make_language_pair(seed)

  def draw(rng, count: int, exclude: set[str], distinct: bool) -> list[tuple[str, str]]:
    out = []
    while len(out) < count:
      for row in rng.random((count - len(out), _DRAWS)).tolist():
        clause = pair._sample_clause(iter(row))
        source = " ".join(pair._source_words(clause))
        if source in exclude:
          continue
        if distinct:
          exclude.add(source)
        out.append((source, " ".join(pair._target_words(clause))))
    return out

  rng = np.random.default_rng([seed, 1])  # a stream separate from the lexicon's
  splits = {"test": draw(rng, num_eval, set(), distinct=True)}
  held_out = {source for source, _ in splits["test"]}
  if num_validation:
    splits["validation"] = draw(
      np.random.default_rng([seed, 2]), num_validation, held_out, distinct=True
    )
    held_out |= {source for source, _ in splits["validation"]}
  splits["train"] = draw(rng, num_train, held_out, distinct=False)
  return splits
