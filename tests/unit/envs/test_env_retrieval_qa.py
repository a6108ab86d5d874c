"""Retrieval QA: BM25 ranking, search budget, grading by EM/F1, tag order, splits, custom corpora."""

from __future__ import annotations

import json

import pytest

from roll_async.envs import RetrievalQAEnv, make_env
from roll_async.envs.retrieval_qa import BM25, exact_match, f1_score, normalize_answer


def test_bm25_prefers_rare_matching_terms_and_skips_non_matches():
    bm = BM25(
        [
            "the river flows north",
            "the town has a river and a bridge",
            "mountains are high",
            "river river river",
        ]
    )
    hits = bm.search("bridge over the river", 4)
    assert hits[0][0] == 1 and 2 not in [i for i, _ in hits]
    assert bm.search("nothing matches", 3) == []


def test_bm25_finds_gold_passage_for_single_hop_questions():
    env = RetrievalQAEnv()
    env.reset(0)
    single = [q for q in env.questions if len(q["passage_ids"]) == 1]

    def hits(k):
        return sum(
            any(
                env.passages[i]["id"] in q["passage_ids"]
                for i, _ in env.bm25.search(q["question"], k)
            )
            for q in single
        )

    assert hits(1) / len(single) > 0.8 and hits(3) / len(single) > 0.95


def test_normalisation_em_and_f1():
    assert normalize_answer("The  Blue-Glass!") == "blueglass"
    assert exact_match("the explorer", ["Explorer"]) == 1.0
    assert exact_match("explorer ship", ["explorer"]) == 0.0
    assert f1_score("copper bells", ["copper bells"]) == 1.0
    assert f1_score("copper", ["copper bells"]) == pytest.approx(2 / 3)


def test_search_shows_top_k_and_budget_is_enforced():
    env = RetrievalQAEnv(max_searches=2, top_k=2, max_steps=5)
    env.reset(4)
    obs, r, term, _, info = env.step("<search>river</search>")
    assert (
        obs.startswith('Search results for "river":')
        and obs.count("\n[") == 2
        and "Searches left: 1" in obs
    )
    assert (r, term) == (0.0, False) and info["metrics"]["num_searches"] == 1.0
    env.step("<search>bridges</search>")
    obs, r, term, _, info = env.step("<search>one more</search>")
    assert r == pytest.approx(-0.1) and info["metrics"]["action_is_valid"] is False
    assert "no searches left" in obs and not term


def test_correct_and_wrong_answers():
    env = RetrievalQAEnv()
    env.reset(7)
    gold = env.question["answers"][0]
    _, r, term, _, info = env.step(f"<answer>The {gold}.</answer>")
    assert (r, term, info["metrics"]["success"], info["metrics"]["exact_match"]) == (
        1.0,
        True,
        True,
        1.0,
    )
    env.reset(7)
    _, r, term, _, info = env.step("<answer>Nobody knows</answer>")
    assert (r, term, info["metrics"]["success"]) == (0.0, True, False)


def test_f1_reward_metric_gives_partial_credit():
    env = RetrievalQAEnv(reward_metric="f1")
    for seed in range(50):
        env.reset(seed)
        if len(env.question["answers"][0].split()) == 2:
            break
    first_word = env.question["answers"][0].split()[0]
    _, r, _, _, info = env.step(f"<answer>{first_word}</answer>")
    assert r == pytest.approx(2 / 3) and info["metrics"]["success"] is False


def test_first_tag_wins():
    env = RetrievalQAEnv()
    env.reset(0)
    _, _, term, _, info = env.step(
        "<search>Harmere</search> then <answer>1115</answer>"
    )
    assert not term and info["actions"] == ["search: Harmere"]
    _, _, term, _, info = env.step("<answer>x</answer> <search>Harmere</search>")
    assert term and info["actions"] == ["answer: x"]


def test_expert_uses_two_hops_for_two_passage_questions():
    env = RetrievalQAEnv()
    for seed in range(100):
        env.reset(seed)
        if len(env.question["passage_ids"]) == 2:
            break
    responses = env.expert_responses()
    assert [r.startswith("<search>") for r in responses] == [True, True, False]
    for resp in responses:
        *_, info = env.step(resp)
    assert info["metrics"]["success"] and info["metrics"]["retrieval_hit"]


def test_splits_are_disjoint():
    train, val = RetrievalQAEnv(split="train"), RetrievalQAEnv(split="val")
    train.reset(0), val.reset(0)
    assert train.questions and val.questions
    assert not {q["id"] for q in train.questions} & {q["id"] for q in val.questions}


def test_custom_corpus_path(tmp_path):
    path = tmp_path / "corpus.json"
    path.write_text(
        json.dumps(
            {
                "passages": [
                    {"id": "a", "title": "Zorb", "text": "Zorb is purple."},
                    {"id": "b", "title": "Quax", "text": "Quax is green."},
                ],
                "questions": [
                    {
                        "id": "q",
                        "question": "What colour is Quax?",
                        "answers": ["green"],
                        "passage_ids": ["b"],
                    }
                ],
            }
        )
    )
    env = make_env("retrieval_qa", {"corpus_path": str(path), "top_k": 1})
    obs, _ = env.reset(123)
    assert obs == "Question: What colour is Quax?"
    obs, *_ = env.step("<search>Quax colour</search>")
    assert "[1] Quax: Quax is green." in obs and "Zorb" not in obs


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"split": "test"}, "split"),
        ({"reward_metric": "bleu"}, "reward_metric"),
        ({"corpus_path": "/nonexistent.json"}, "not a file"),
    ],
)
def test_bad_parameters_fail_at_construction(cfg, message):
    with pytest.raises(ValueError, match=message):
        make_env("retrieval_qa", cfg)
