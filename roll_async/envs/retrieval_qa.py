"""Retrieval QA: a tool-use env where the model searches a small corpus before answering.

Search-then-answer is the simplest tool-use loop; the shipped corpus describes
a made-up world, so the model cannot answer from memory and has to search.
"""

from __future__ import annotations

import json
import math
import re
import string
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from roll_async.envs.base import BaseEnv, EnvConfig, InvalidAction
from roll_async.envs.parsing import ParsedAction, wrap_with_pattern
from roll_async.envs.tool_actions import decode_tool_calls, function_tool
from roll_async.errors import ConfigError, DatasetError

DEFAULT_CORPUS = Path(__file__).parent / "data" / "retrieval_qa.json"
_STOPWORDS = frozenset(
    "a an the of in on at to for by with from and or is was were be been are it its this that which who whom what "
    "when where how many much did does do as into after".split()
)


@dataclass
class RetrievalQAConfig(EnvConfig):
    max_steps: int = 4
    #: Passages shown per search.
    top_k: int = 3
    max_searches: int = 3
    #: JSON corpus + questions; None means the shipped fictional-world corpus.
    corpus_path: str | None = None
    #: Which questions to draw from: train, val or all.
    split: str = "all"
    #: em (exact match) or f1.
    reward_metric: str = "em"
    answer_reward: float = 1.0
    search_reward: float = 0.0
    search_pattern: str = r"<search>(.*?)</search>"
    #: tags: ``<search>`` / ``<answer>`` in the text; tools: the ``search`` and ``answer`` function tools.
    action_format: str = "tags"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.action_format not in ("tags", "tools"):
            raise ConfigError(
                f"action_format must be tags or tools, got {self.action_format!r}"
            )
        if self.split not in ("train", "val", "all"):
            raise ConfigError(f"split must be train, val or all, got {self.split!r}")
        if self.reward_metric not in ("em", "f1"):
            raise ConfigError(
                f"reward_metric must be em or f1, got {self.reward_metric!r}"
            )
        if int(self.top_k) < 1 or int(self.max_searches) < 0:
            raise ConfigError(
                f"top_k must be >= 1 and max_searches >= 0, got {self.top_k}, {self.max_searches}"
            )
        self.top_k, self.max_searches = int(self.top_k), int(self.max_searches)
        if self.corpus_path is not None and not Path(self.corpus_path).is_file():
            raise ConfigError(f"corpus_path {self.corpus_path!r} is not a file")
        try:
            re.compile(self.search_pattern)
        except re.error as e:
            raise ConfigError(
                f"search_pattern {self.search_pattern!r} is not a valid regex: {e}"
            ) from e


class BM25:
    """Okapi BM25 over a small in-memory corpus (k1=1.5, b=0.75)."""

    def __init__(self, docs: list[str], k1: float = 1.5, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.tfs = [Counter(tokenize(d)) for d in docs]
        self.lengths = [sum(tf.values()) for tf in self.tfs]
        self.avg_len = sum(self.lengths) / max(1, len(docs))
        df = Counter(t for tf in self.tfs for t in tf)
        n = len(docs)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def scores(self, query: str) -> list[float]:
        terms = tokenize(query)
        out = []
        for tf, length in zip(self.tfs, self.lengths):
            s = 0.0
            for t in terms:
                f = tf.get(t, 0)
                if f:
                    s += (
                        self.idf[t]
                        * f
                        * (self.k1 + 1)
                        / (f + self.k1 * (1 - self.b + self.b * length / self.avg_len))
                    )
            out.append(s)
        return out

    def search(self, query: str, k: int) -> list[tuple[int, float]]:
        """Top-k (doc index, score), best first; documents with score 0 are left out; ties keep corpus order."""
        ranked = sorted(enumerate(self.scores(query)), key=lambda x: -x[1])
        return [(i, s) for i, s in ranked[:k] if s > 0]


def tokenize(text: str) -> list[str]:
    return [t for t in re.findall(r"[a-z0-9]+", text.lower()) if t not in _STOPWORDS]


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, answers: list[str]) -> float:
    return float(
        any(normalize_answer(prediction) == normalize_answer(a) for a in answers)
    )


def f1_score(prediction: str, answers: list[str]) -> float:
    best = 0.0
    pred = normalize_answer(prediction).split()
    for a in answers:
        gold = normalize_answer(a).split()
        common = sum((Counter(pred) & Counter(gold)).values())
        if common:
            p, r = common / len(pred), common / len(gold)
            best = max(best, 2 * p * r / (p + r))
    return best


class RetrievalQAEnv(BaseEnv):
    """Search-then-answer QA over a BM25-indexed corpus.

    The shipped corpus (``data/retrieval_qa.json``) describes a made-up world of
    towns, people and mountains, so the model cannot answer from memory; some
    questions need two hops (e.g. the birthplace of whoever first climbed a
    mountain). ``corpus_path`` points to another file of the same shape::

        {"passages": [{"id", "title", "text"}],
         "questions": [{"id", "question", "answers": [str], "passage_ids": [str], "split": "train"|"val"}]}

    Each turn the model either searches with ``<search>query</search>`` and sees
    the ``top_k`` passages ranked by BM25 (implemented here, no dependency), or
    answers with ``<answer>...</answer>``, which ends the episode. When a response
    holds both, the one that comes first counts (what follows it was written
    without seeing the results). At most ``max_searches`` searches are allowed.

    Text render: ``Question: ...`` first; after a search::
    """

    config_cls: ClassVar[type] = RetrievalQAConfig
    multi_action: ClassVar[bool] = False

    def __init__(
        self, config: RetrievalQAConfig | dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(config, **kwargs)
        self.config: RetrievalQAConfig
        self._search_re = re.compile(self.config.search_pattern, re.DOTALL)
        self.passages: list[dict[str, str]] = []
        self.questions: list[dict[str, Any]] = []
        self.bm25: BM25 | None = None
        self.question: dict[str, Any] = {}
        self.searches = 0
        self.retrieved: set[str] = set()
        self.results_text = ""
        self.em = self.f1 = 0.0

    def _load(self) -> None:
        """Read and index the corpus on first use, so constructing the env stays cheap."""
        data = json.loads(
            Path(self.config.corpus_path or DEFAULT_CORPUS).read_text(encoding="utf-8")
        )
        self.passages = data["passages"]
        split = self.config.split
        self.questions = [
            q
            for q in data["questions"]
            if split == "all" or q.get("split", "train") == split
        ]
        if not self.questions:
            raise DatasetError(
                f"corpus {self.config.corpus_path or DEFAULT_CORPUS} has no questions in split {split!r}"
            )
        self.bm25 = BM25([f"{p['title']} {p['text']}" for p in self.passages])

    def _reset(self, seed: int) -> None:
        if self.bm25 is None:
            self._load()
        rng = np.random.default_rng(seed)
        self.question = self.questions[int(rng.integers(len(self.questions)))]
        self.searches = 0
        self.retrieved = set()
        self.results_text = ""
        self.em = self.f1 = 0.0

    def tools(self) -> list[dict[str, Any]] | None:
        if self.config.action_format != "tools":
            return None
        return [
            function_tool(
                "search",
                f"Search the encyclopedia; returns the top {self.config.top_k} passages.",
                {"query": {"type": "string"}},
                ["query"],
            ),
            function_tool(
                "answer",
                "Give the final answer in a few words; ends the episode.",
                {"answer": {"type": "string"}},
                ["answer"],
            ),
        ]

    def _parse(self, action_text: str) -> ParsedAction:
        if self.config.action_format == "tools":
            return self._parse_calls(action_text)
        search = self._search_re.search(action_text or "")
        answer = self.parser.regex.search(action_text or "")
        if search and (not answer or search.start() < answer.start()):
            query = search.group(1).strip()
            if not query:
                return ParsedAction(raw=search.group(1), error="empty search query")
            return ParsedAction(actions=[f"search: {query}"], raw=query, is_valid=True)
        parsed = self.parser.parse(
            action_text[: answer.end()] if answer else action_text
        )
        parsed.actions = [f"answer: {a}" for a in parsed.actions]
        if parsed.error and parsed.error.startswith("no action found"):
            parsed.error = (
                f"no action found; search with {wrap_with_pattern(self.config.search_pattern, 'query')} "
                f"or answer with {self.parser.wrap('...')}"
            )
        return parsed

    def _parse_calls(self, action_text: str) -> ParsedAction:
        """The first call of a tools-mode action: ``search(query)`` or ``answer(answer)``."""
        calls = decode_tool_calls(action_text)
        if not calls:
            return ParsedAction(
                error="no tool call; call the search tool or the answer tool"
            )
        name, arguments = calls[0]
        key = {"search": "query", "answer": "answer"}.get(name)
        value = str(arguments.get(key, "")).strip() if key else ""
        if not value:
            return ParsedAction(
                raw=name,
                error=f"call search(query) or answer(answer) with a non-empty value, not {name}({arguments})",
            )
        return ParsedAction(actions=[f"{name}: {value}"], raw=value, is_valid=True)

    def _apply(self, action: str) -> tuple[float, bool, str]:
        kind, _, text = action.partition(": ")
        cfg = self.config
        if kind == "search":
            if self.searches >= cfg.max_searches:
                raise InvalidAction(
                    f"no searches left (limit {cfg.max_searches}); answer now"
                )
            self.searches += 1
            assert self.bm25 is not None
            hits = self.bm25.search(text, cfg.top_k)
            self.retrieved |= {self.passages[i]["id"] for i, _ in hits}
            lines = [f'Search results for "{text}":']
            lines += [
                f"[{n}] {self.passages[i]['title']}: {self.passages[i]['text']}"
                for n, (i, _) in enumerate(hits, 1)
            ]
            if not hits:
                lines.append("No passage matches.")
            lines.append(f"Searches left: {cfg.max_searches - self.searches}")
            self.results_text = "\n".join(lines)
            return cfg.search_reward, bool(hits), ""
        answers = self.question["answers"]
        self.em, self.f1 = exact_match(text, answers), f1_score(text, answers)
        self.success = self.em == 1.0
        self.done = True
        self.results_text = (
            "Your answer is correct." if self.success else "Your answer is not correct."
        )
        return (
            cfg.answer_reward * (self.em if cfg.reward_metric == "em" else self.f1),
            True,
            "",
        )

    def extra_metrics(self) -> dict[str, float | bool]:
        hit = bool(set(self.question.get("passage_ids", [])) & self.retrieved)
        return {
            "num_searches": float(self.searches),
            "exact_match": self.em,
            "f1": self.f1,
            "retrieval_hit": hit,
        }

    def render_text(self) -> str:
        return self.results_text or f"Question: {self.question['question']}"

    def instruction(self) -> str:
        cfg = self.config
        if cfg.action_format == "tools":
            return (
                "Answer a question about a fictional world using a search engine over its encyclopedia. "
                f"Call the search tool to see the top {cfg.top_k} passages for a query (at most "
                f"{cfg.max_searches} times), then call the answer tool with the answer in a few words."
            )
        return (
            "Answer a question about a fictional world using a search engine over its encyclopedia. "
            f"Search with {wrap_with_pattern(cfg.search_pattern, 'your query')}; you will see the top {cfg.top_k} "
            f"passages. You may search at most {cfg.max_searches} times. When you know the answer, give it "
            f"in a few words with {self.parser.wrap('your answer')}, for example {self.parser.wrap('1204')}. "
            f"The answer is graded by {'exact match' if cfg.reward_metric == 'em' else 'word overlap (F1)'}."
        )

    def solve(self) -> list[str] | None:
        """Whole tagged responses: a search for each gold passage's title (as searches allow), then the answer."""
        titles = {p["id"]: p["title"] for p in self.passages}
        left = self.config.max_searches - self.searches
        searches = [
            wrap_with_pattern(self.config.search_pattern, titles[pid])
            for pid in self.question["passage_ids"]
        ]
        return searches[: max(0, left)] + [
            self.parser.wrap(self.question["answers"][0])
        ]

    def expert_responses(self) -> list[str] | None:
        """Tagged responses; None in tools mode (a call's text depends on the model's format)."""
        return None if self.config.action_format == "tools" else self.solve()
