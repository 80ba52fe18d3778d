"""The synthetic language pair: deterministic, learnable, and not a copy or a reversal."""

import numpy as np
import pytest

from transformer_mt.data import synthetic
from transformer_mt.data.synthetic import OBJECT, OBLIQUE, PLURAL, SINGULAR, SUBJECT


@pytest.fixture(scope="module")
def pair():
  return synthetic.make_language_pair(0)


@pytest.fixture(scope="module")
def splits():
  splits = synthetic.generate_splits(3000, 300, seed=0)
  return splits["train"], splits["test"]


def _noun(pair, english: str) -> int:
  return [forms[0] for forms in pair.source_nouns].index(english)


def _determiner_cells(pair):
  """Target determiner form -> (determiner, case, gender, number): every form is unique."""
  cells = {}
  for det, stem in enumerate(pair.target_determiners):
    for case in range(3):
      for gender in range(3):
        for number in range(2):
          cells[synthetic.determiner_form(stem, case, gender, number)] = (det, case, gender, number)
  assert len(cells) == 18 * len(pair.target_determiners)
  return cells


def test_same_seed_same_data_different_seed_different_data():
  assert synthetic.generate_splits(200, 50, seed=3) == synthetic.generate_splits(200, 50, seed=3)
  assert synthetic.generate_splits(200, 50, seed=3) != synthetic.generate_splits(200, 50, seed=4)
  build = synthetic.make_language_pair.__wrapped__  # bypass the cache: rebuild from scratch
  assert build(3) == build(3)
  pair = synthetic.make_language_pair(3)
  assert pair.target_nouns != synthetic.make_language_pair(4).target_nouns
  rng_a, rng_b = np.random.default_rng(7), np.random.default_rng(7)
  assert [pair.sample_source(rng_a) for _ in range(20)] == [
    pair.sample_source(rng_b) for _ in range(20)
  ]


def test_eval_sources_distinct_and_unseen_in_train(splits):
  train, eval_ = splits
  assert len(train) == 3000 and len(eval_) == 300
  eval_sources = [source for source, _ in eval_]
  assert len(set(eval_sources)) == len(eval_sources)
  assert not set(eval_sources) & {source for source, _ in train}


def test_eval_set_does_not_depend_on_train_size():
  small = synthetic.generate_splits(10, 100, seed=1)["test"]
  assert synthetic.generate_splits(500, 100, seed=1)["test"] == small


def test_validation_is_distinct_unseen_and_leaves_test_unchanged():
  without = synthetic.generate_splits(500, 100, seed=1)
  splits = synthetic.generate_splits(500, 100, seed=1, num_validation=80)
  assert splits["test"] == without["test"]
  validation = {source for source, _ in splits["validation"]}
  assert len(validation) == 80
  assert not validation & {source for source, _ in splits["test"]}
  assert not validation & {source for source, _ in splits["train"]}


def test_vocabulary_sizes(pair):
  lemmas = (pair.source_nouns, pair.source_adjectives, pair.source_verbs)
  assert [len(words) for words in lemmas] == [80, 40, 50]
  assert (len(pair.source_prepositions), len(pair.source_adverbs)) == (10, 20)
  # 160 noun + 150 verb forms + 40 + 10 + 20 + 10 determiners: no word serves two categories.
  assert len(pair.source_vocabulary) == 390
  # 160 noun + 200 verb + 40 * 11 adjective + 6 * 18 determiner forms + 10 + 20, all distinct.
  assert len(pair.target_vocabulary) == 938
  assert sorted(set(pair.noun_genders)) == [0, 1, 2]


def test_sentences_use_only_their_own_vocabulary(pair, splits):
  source_vocab, target_vocab = set(pair.source_vocabulary), set(pair.target_vocabulary)
  assert not source_vocab & target_vocab
  for source, target in splits[0] + splits[1]:
    assert 5 <= len(source.split()) <= 20
    assert set(source.split()) <= source_vocab
    assert set(target.split()) <= target_vocab  # hence no source word ever appears in a target


def test_translate_matches_the_generated_targets(pair, splits):
  for source, target in splits[0][:1000] + splits[1]:
    assert pair.translate(source) == target
  rng = np.random.default_rng(0)
  for _ in range(200):
    pair.translate(pair.sample_source(rng))  # every sampled sentence parses


def test_word_order_is_sov_with_adjectives_after_the_noun(pair):
  target = pair.translate("the big dog watches a small cat").split()
  dog, cat = _noun(pair, "dog"), _noun(pair, "cat")
  big, small = pair.source_adjectives.index("big"), pair.source_adjectives.index("small")
  watch = [forms[1] for forms in pair.source_verbs].index("watch")
  assert target[1] == pair.target_nouns[dog][SINGULAR]
  assert target[2].startswith(pair.target_adjectives[big])
  assert target[4] == pair.target_nouns[cat][SINGULAR]
  assert target[5].startswith(pair.target_adjectives[small])
  assert target[6].startswith(pair.target_verbs[watch])  # the verb moved from position 3 to last
  # The prepositional phrase becomes "Det Noun Postposition", before the adverb and the verb.
  target = pair.translate("the dog watches a cat in the garden quickly").split()
  assert target[5] == pair.target_nouns[_noun(pair, "garden")][SINGULAR]
  assert target[6] == pair.target_postpositions[pair.source_prepositions.index("in")]
  assert target[7] == pair.target_adverbs[pair.source_adverbs.index("quickly")]
  assert target[8].startswith(pair.target_verbs[watch]) and len(target) == 9


def test_the_verb_moves_from_after_the_subject_to_the_end(pair, splits):
  source_verbs = {w for forms in pair.source_verbs for w in forms}
  target_verbs = {
    synthetic.target_verb_form(stem, tense, number)
    for stem in pair.target_verbs
    for tense in range(2)
    for number in range(2)
  }
  for source, target in splits[1]:
    source_positions = [i for i, w in enumerate(source.split()) if w in source_verbs]
    target_positions = [i for i, w in enumerate(target.split()) if w in target_verbs]
    assert len(source_positions) == 1 and 2 <= source_positions[0] <= len(source.split()) - 3
    assert target_positions == [len(target.split()) - 1]


def test_determiners_agree_with_the_nouns_gender_number_and_case(pair, splits):
  cells = _determiner_cells(pair)
  nouns = {
    w: (noun, number)
    for noun, forms in enumerate(pair.target_nouns)
    for number, w in enumerate(forms)
  }
  seen_genders = {}
  for _, target in splits[0]:
    words = target.split()
    for det_word, noun_word in zip(words, words[1:]):
      if det_word in cells:
        noun, number = nouns[noun_word]  # a determiner is always followed by its noun
        _, _, gender, det_number = cells[det_word]
        assert det_number == number
        seen_genders.setdefault(noun, set()).add(gender)
  assert len(seen_genders) == len(pair.target_nouns)
  assert all(genders == {pair.noun_genders[noun]} for noun, genders in seen_genders.items())


def test_case_changes_the_determiner_and_the_adjective(pair):
  as_subject = pair.translate("the old dog watches the cat").split()
  as_object = pair.translate("the cat watches the old dog").split()
  in_pp = pair.translate("the cat watches the bird with the old dog").split()
  cells = _determiner_cells(pair)
  cases = [cells[as_subject[0]][1], cells[as_object[2]][1], cells[in_pp[4]][1]]
  assert cases == [SUBJECT, OBJECT, OBLIQUE]
  assert as_subject[1] == as_object[3] == in_pp[5]  # the noun itself does not inflect for case
  assert len({as_subject[2], as_object[4], in_pp[6]}) == 3  # ... but its adjective does


def test_the_verb_agrees_with_the_subject_even_where_english_does_not(pair):
  sg = pair.translate("the dog watches the cat").split()
  pl = pair.translate("the dogs watch the cat").split()
  assert sg[-1] != pl[-1] and sg[0] != pl[0] and sg[2:4] == pl[2:4]
  # English "watched" is the same for both numbers; the target verb still differs.
  past_sg = pair.translate("the dog watched the cat").split()[-1]
  past_pl = pair.translate("the dogs watched the cat").split()[-1]
  assert past_sg != past_pl
  assert len({sg[-1], pl[-1], past_sg, past_pl}) == 4
  # The object's number does not affect the verb.
  assert pair.translate("the dog watches the cats").split()[-1] == sg[-1]
  assert _determiner_cells(pair)[pl[0]][3] == PLURAL


@pytest.mark.parametrize(
  "sentence",
  [
    "",
    "the dog",
    "the dog watches",
    "dog the watches cat the",
    "the dog watches the cat the",
    "the dogs watches the cat",  # subject-verb agreement
    "the dog watch the cat",
    "a dogs watch the cat",  # determiner-noun agreement
    "these dog watches the cat",
    "an dog watches the cat",  # a/an
    "a apple watches the cat",
    "the dog watches the cat xyzzy",  # unknown word
    "the dog watches the cat in",
    "the dog watches the cat quickly slowly",
    "the big old red dog watches the cat",  # at most two adjectives
    "the dog watches the cat in the box on the bus with the car",  # at most two PPs
    "the Dog watches the cat",
  ],
)
def test_translate_rejects_ungrammatical_sentences(pair, sentence):
  with pytest.raises(ValueError, match="not a sentence of the synthetic source grammar"):
    pair.translate(sentence)


def test_translate_accepts_the_longest_sentences(pair):
  sentence = (
    "an old big apple watched the old big cake in the old big box on the old big bus quickly"
  )
  assert len(sentence.split()) == 20 == len(pair.translate(sentence).split())
