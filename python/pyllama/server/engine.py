"""The server's engine: one model, one context with one sequence per slot, and the scheduler
thread that is the context's only user (continuous batching, as llama-server).

HTTP handlers never touch the context: they build a :class:`Job` (prompt tokens, a sampler,
stop rules and an ``emit`` callback) and :meth:`Engine.submit` it. The scheduler thread
loops over steps; each step is one ``llama_decode`` over every active slot: the token each
generating slot sampled last, then prompt chunks of the slots still reading their prompt,
up to n_batch tokens. After the decode every slot with an output samples its next token and
emits it. The Rust forward pass releases the GIL, so the event loop keeps serving HTTP while
the model runs.

Batch invariance: pyllama's forward pass gives a sequence the same logits whatever else is
in the batch or the cache (tests/models/test_determinism.py), and each job samples with its own
seeded chain, so a request's output does not depend on its batch mates or arrival order.

Prompt cache: an idle slot keeps its sequence in the KV cache; a new job goes to the idle
slot whose cached tokens share the longest prefix with its prompt, and only the rest of the
prompt is decoded (llama-server's slot similarity and prompt cache).
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from ..batch import batch_add, batch_init
from ..context import Context
from ..llama import Llama
from ..generation import StopText, common_prefix, context_shift

log = logging.getLogger("pyllama.server")

__all__ = ["Engine", "EngineConfig", "Job", "QueueFull", "PromptTooLong"]


class QueueFull(Exception):
    """The waiting queue is full (HTTP 503)."""


class PromptTooLong(ValueError):
    """A prompt that no slot can hold (HTTP 400 with llama-server's exceed_context_size_error)."""

    def __init__(self, n_prompt: int, n_ctx: int, why: str = ""):
        super().__init__(f"request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens), "
                         f"try increasing it{why}")
        self.n_prompt = n_prompt
        self.n_ctx = n_ctx


@dataclass
class EngineConfig:
    """What ``pyllama serve`` sets up. ``n_parallel`` slots share one context of ``n_ctx``
    cells; with ``kv_unified`` each slot may use the whole context (llama-server's default
    when -np is not given), otherwise each gets ``n_ctx / n_parallel`` cells."""

    n_ctx: int = 4096
    n_batch: int = 2048
    n_ubatch: int = 512
    n_parallel: int = 4
    kv_unified: bool = True
    n_threads: int = 0
    n_threads_batch: int = 0
    type_k: str = "f16"
    type_v: str = "f16"
    context_shift: bool = False
    n_keep: int = 0
    cache_reuse: int = 0      # --cache-reuse: min chunk reused by KV shifting (0: off)
    max_queue: int = 64
    flash_attn: int = -1      # LLAMA_FLASH_ATTN_TYPE: -1 auto, 0 off, 1 on
    embedding: bool = False   # an embeddings server: every token is an output, no generation
    pooling: int = -1         # LLAMA_POOLING_TYPE_* with embedding (-1: the model's, none for decoders)
    loras: list = field(default_factory=list)            # [(path, scale)]: --lora / --lora-scaled
    control_vectors: list = field(default_factory=list)  # [(path, scale)]: --control-vector[-scaled]
    cvec_range: Optional[tuple] = None                   # --control-vector-layer-range (start, end)
    offload_kqv: bool = True  # -nkvo false: the KV cache of GPU-offloaded layers stays on the CPU


@dataclass
class Job:
    """One generation. ``emit(event)`` is called from the scheduler thread with dicts:

    - ``{"type": "token", "token": id, "text": str, "logprob": float|None, "top": [(id, lp)]}``
      per generated token (``text`` may be empty while a stop string or UTF-8 character is
      incomplete);
    - ``{"type": "done", "finish_reason": "stop"|"length", "stop_type": "eos"|"word"|"limit",
      "stopping_word": str, "text": str, ...}`` once, with usage and timings;
    - ``{"type": "error", "message": str}`` if the decode failed;
    - with ``progress``, ``{"type": "progress", "total", "cache", "processed", "time_ms"}``
      when the prompt starts and after each decode of one of its chunks.

    With ``post_sampling``, token events carry ``"prob"`` and ``"top": [(id, p)]`` (the
    sampler chain's final probabilities) instead of log-probabilities; with
    ``timings_per_token`` they carry ``"timings"``.
    """

    prompt: list
    sampler: Any                 # .sample(logits) -> token (a SamplerChain or grammar-first sampler)
    chain: Any                   # the SamplerChain inside (prompt tokens are accepted into it)
    emit: Callable[[dict], None]
    n_predict: int = -1          # < 0: until the slot is full
    stops: list = field(default_factory=list)
    n_probs: int = 0             # top log-probabilities per token (0: none; -1: the token's only)
    ignore_eos: bool = False
    n_keep: Optional[int] = None # tokens a context shift keeps (None: --keep; -1: the prompt)
    id_slot: int = -1            # run in this slot (waits for it); -1: the best idle one
    cache_prompt: bool = True    # reuse the slot's cached prefix (llama-server's cache_prompt)
    n_cache_reuse: Optional[int] = None  # reuse cached chunks of at least this many tokens by KV shifting
    n_discard: int = 0           # tokens a context shift drops (0: half of those not kept)
    n_indent: int = 0            # stop at a new line indented by fewer spaces/tabs (llama-server's)
    t_max_predict_ms: int = -1   # stop at a new line once generating took longer than this
    post_sampling: bool = False  # n_probs from the sampler chain's final candidates (probabilities)
    progress: bool = False       # emit "progress" events while the prompt is processed
    timings_per_token: bool = False  # token events carry the timings so far
    embed: bool = False          # an embeddings job: the prompt is decoded in one step, then "done"
    normalize: int = 2           # with embed: llama.cpp's --embd-normalize
    id: int = 0
    cancelled: bool = False
    # filled by the engine
    slot: int = -1
    n_cached: int = 0
    n_gen: int = 0
    t_queued: float = 0.0
    t_start: float = 0.0
    t_prompt_done: float = 0.0
    t_end: float = 0.0
    done: bool = False
    last_nl: int = 0             # n_indent: where the newest line of the text starts
    new_line: bool = False       # a new line has been sent (n_indent, t_max_predict_ms)

    def cancel(self) -> None:
        """Stop this job at the next step (a client that went away); its slot is freed."""
        self.cancelled = True


class Slot:
    def __init__(self, sid: int):
        self.id = sid                 # also its sequence id in the context
        self.cache: list = []         # the tokens the KV cache holds for this sequence
        self.job: Optional[Job] = None
        self.pending: list = []       # prompt tokens still to decode
        self.next_token: Optional[int] = None  # sampled, decoded in the next step
        self.out: Optional[StopText] = None
        self.t_last = 0.0
        self.n_shifted = 0

    @property
    def busy(self) -> bool:
        return self.job is not None


class Engine:
    """Owns the context and the scheduler thread. ``start()`` / ``stop()``; ``submit(job)``."""

    def __init__(self, model, vocab, config: EngineConfig):
        self.model = model
        self.vocab = vocab
        self.config = config
        extra = {}
        if config.embedding:
            extra = {"embeddings": True, "pooling_type": config.pooling}
        self.ctx = Context(model, n_ctx=config.n_ctx, n_batch=config.n_batch, n_ubatch=config.n_ubatch,
                           n_seq_max=config.n_parallel, kv_unified=config.kv_unified,
                           n_threads=config.n_threads, n_threads_batch=config.n_threads_batch,
                           type_k=config.type_k, type_v=config.type_v, no_perf=False,
                           flash_attn_type=config.flash_attn, offload_kqv=config.offload_kqv, **extra)
        self.pooling = int(self.ctx.pooling_type)
        # --cache-reuse moves cached cells to new positions (seq_add re-ropes K); a recurrent
        # state cannot drop tokens from its middle, so it reuses only the common prefix
        self.can_shift = bool(self.ctx.memory_can_shift) and self.ctx.memory_kind == "kv"
        self.n_ctx = int(self.ctx.n_ctx)
        self.n_ctx_slot = int(self.ctx.n_ctx_seq)
        self.n_batch = int(self.ctx.n_batch)
        self.n_vocab = len(vocab)
        self.slots = [Slot(i) for i in range(config.n_parallel)]
        self._queue: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._stopping = False
        self._thread: Optional[threading.Thread] = None
        self._ids = itertools.count(1)
        self._batch = batch_init(self.n_batch, 0, 1)
        # llama-server's /metrics counters
        self.m = {"prompt_tokens_total": 0, "prompt_seconds_total": 0.0, "tokens_predicted_total": 0,
                  "tokens_predicted_seconds_total": 0.0, "n_decode_total": 0, "n_busy_slots_total": 0,
                  "n_tokens_max": 0, "requests_total": 0, "requests_cancelled": 0, "prompt_tokens_cached_total": 0}
        self.fatal: Optional[str] = None
        self._init_adapters(model, config)

    # -- LoRA adapters and control vectors --------------------------------------------------

    def _init_adapters(self, model, config: EngineConfig) -> None:
        """Load --lora / --control-vector files as llama-server does (common_init_from_params):
        a control vector on layers [start, end] (start <= 0: 1; end <= 0: the last layer);
        every adapter loaded, then set with its scale."""
        from ..adapter import ControlVector, LoraAdapter

        if config.control_vectors:
            n_layer = int(model.hparams["n_layer"])
            start, end = config.cvec_range if config.cvec_range is not None else (-1, -1)
            self.ctx.set_control_vector(ControlVector.load(config.control_vectors),
                                        layer_start=1 if start <= 0 else start, layer_end=n_layer if end <= 0 else end)
        self.loras = [LoraAdapter(model, p) for p, _ in config.loras]
        for a in self.loras:
            if a.alora_invocation_tokens:
                # llama-server decodes the prompt before the invocation tokens without the
                # adapter (per slot); this engine sets adapters for the whole context
                raise ValueError(f"{a.path} is an activated LoRA (adapter.alora.invocation_tokens): pyllama serve "
                                 "cannot apply it only from its invocation tokens on, as llama-server does")
        self.lora_scales = [float(sc) for _, sc in config.loras]
        self._lora_pending: Optional[list] = None  # scales POSTed, applied before the next job starts
        if self.loras:
            self.ctx.set_lora_adapters(list(zip(self.loras, self.lora_scales)))

    def lora_info(self) -> list:
        """GET /lora-adapters: llama-server's entries (id, path, scale, task_name,
        prompt_prefix; aLoRA invocation string and tokens when the adapter has them)."""
        with self._cv:
            scales = list(self._lora_pending if self._lora_pending is not None else self.lora_scales)
        out = []
        for i, (a, sc) in enumerate(zip(self.loras, scales)):
            md = a.metadata
            e = {"id": i, "path": a.path, "scale": sc, "task_name": md.get("adapter.lora.task_name", ""),
                 "prompt_prefix": md.get("adapter.lora.prompt_prefix", "")}
            toks = a.alora_invocation_tokens
            if toks:
                e["alora_invocation_string"] = b"".join(
                    self.vocab.token_to_piece(t, special=True) for t in toks).decode("utf-8", "replace")
                e["alora_invocation_tokens"] = toks
            out.append(e)
        return out

    def set_lora_scales(self, config: dict) -> None:
        """POST /lora-adapters: adapter id -> scale; adapters not named get 0 (llama-server's
        construct_lora_list). Jobs already running finish with the scales they started
        with: the new ones are set before the next job starts (new jobs wait for the running
        ones to finish first), and the slots' cached prompts, computed with the old
        adapters, are dropped."""
        scales = [float(config.get(i, 0.0)) for i in range(len(self.loras))]
        with self._cv:
            self._lora_pending = scales
            self._cv.notify_all()

    def _apply_pending_lora(self) -> None:
        scales, self._lora_pending = self._lora_pending, None
        if scales is None or scales == self.lora_scales:
            return
        self.ctx.set_lora_adapters(list(zip(self.loras, scales)))
        self.lora_scales = scales
        for s in self.slots:
            if s.cache:
                self.ctx.seq_rm(s.id, -1, -1)
                s.cache = []

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pyllama-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.ctx.close()

    # -- the queue ------------------------------------------------------------------------

    def check_prompt(self, n_prompt: int) -> None:
        """A prompt of ``n_prompt`` tokens must leave room for at least one generated token
        in a slot (llama-server: 'the request exceeds the available context size')."""
        if n_prompt == 0:
            raise ValueError("the prompt is empty (it tokenizes to no tokens)")
        if self.config.context_shift:
            return  # a long prompt keeps its first n_keep tokens and its end (see _truncate)
        if n_prompt >= self.n_ctx_slot:
            raise PromptTooLong(n_prompt, self.n_ctx_slot,
                                f" (a slot holds the prompt and at least one generated token; -c {self.n_ctx} "
                                f"over {len(self.slots)} slots{', unified KV cache' if self.config.kv_unified else ''})")

    def check_embed_input(self, n: int) -> None:
        """An embeddings input is decoded in one step: it must fit the batch and a slot."""
        if n == 0:
            raise ValueError("an input is empty (it tokenizes to no tokens)")
        if n > self.n_batch or n > self.n_ctx_slot:
            raise PromptTooLong(n, min(self.n_batch, self.n_ctx_slot),
                                f" (an input is decoded in one batch: -b {self.n_batch}, a slot holds {self.n_ctx_slot})")

    def submit(self, job: Job) -> Job:
        """Queue ``job`` (its prompt already checked); raises :class:`QueueFull`."""
        if job.id_slot >= len(self.slots):
            raise ValueError(f"id_slot {job.id_slot} does not exist (the server has {len(self.slots)} slots)")
        if job.embed:
            self.check_embed_input(len(job.prompt))
        else:
            self.check_prompt(len(job.prompt))
        if self.fatal is not None:
            raise RuntimeError(f"the engine has stopped: {self.fatal}")
        with self._cv:
            if len(self._queue) >= self.config.max_queue:
                raise QueueFull(f"the server is busy: {len(self._queue)} requests are waiting "
                                f"(the queue holds {self.config.max_queue}); try again later")
            job.id = next(self._ids)
            job.t_queued = time.perf_counter()
            self._queue.append(job)
            self.m["requests_total"] += 1
            self._cv.notify_all()
        return job

    def wake(self) -> None:
        """Make the scheduler look at cancellations now."""
        with self._cv:
            self._cv.notify_all()

    @property
    def n_waiting(self) -> int:
        return len(self._queue)

    @property
    def n_busy(self) -> int:
        return sum(1 for s in self.slots if s.busy)

    # -- the scheduler thread --------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._stopping and not self._queue and not any(s.busy for s in self.slots):
                        self._cv.wait()
                    if self._stopping:
                        break
                    self._drop_cancelled_waiting()
                    if self._lora_pending is not None and any(s.busy for s in self.slots):
                        starts = []  # new adapter scales wait for the running jobs to finish
                    else:
                        if self._lora_pending is not None:
                            self._apply_pending_lora()
                        starts = self._assign()
                for slot, job in starts:
                    self._start(slot, job)
                self._step()
        except BaseException as e:  # a bug: fail every job instead of leaving clients hanging
            self.fatal = f"{type(e).__name__}: {e}"
            log.exception("scheduler stopped")
            for s in self.slots:
                if s.job is not None:
                    self._fail(s, self.fatal)
            with self._cv:
                while self._queue:
                    job = self._queue.popleft()
                    job.done = True
                    job.emit({"type": "error", "message": self.fatal})
        finally:
            with self._cv:
                for s in self.slots:
                    if s.job is not None:
                        self._fail(s, "the server is shutting down")
                while self._queue:
                    job = self._queue.popleft()
                    job.done = True
                    job.emit({"type": "error", "message": "the server is shutting down"})

    def _drop_cancelled_waiting(self) -> None:
        if any(j.cancelled for j in self._queue):
            keep = collections.deque()
            for j in self._queue:
                if j.cancelled:
                    j.done = True
                    self.m["requests_cancelled"] += 1
                else:
                    keep.append(j)
            self._queue = keep

    def _assign(self) -> list:
        """Pair waiting jobs (FIFO) with idle slots: the idle slot whose cache shares the
        longest prefix with the prompt, else the least recently used one; a job that asked
        for a slot (id_slot) waits for that one, without holding up the jobs behind it."""
        starts = []
        waiting = collections.deque()
        while self._queue:
            idle = [s for s in self.slots if not s.busy]
            if not idle:
                break
            job = self._queue.popleft()
            if job.id_slot >= 0:
                slot = self.slots[job.id_slot]
                if slot.busy:
                    waiting.append(job)
                    continue
                slot.job = job
                starts.append((slot, job))
                continue
            best, best_n = None, 0
            for s in idle:
                n = common_prefix(s.cache, job.prompt)
                if n > best_n:
                    best, best_n = s, n
            if best is None:
                best = min(idle, key=lambda s: s.t_last)
            best.job = job
            starts.append((best, job))
        self._queue.extendleft(reversed(waiting))
        return starts

    def _start(self, slot: Slot, job: Job) -> None:
        job.slot = slot.id
        job.t_start = time.perf_counter()
        if len(job.prompt) >= self.n_ctx_slot:  # only with context shift: keep n_keep + the tail
            job.prompt = self._truncate(job)
        prompt = job.prompt
        # an embedding needs every token of its input in one decode
        common = common_prefix(slot.cache, prompt) if job.cache_prompt and not job.embed else 0
        n_reuse = self.config.cache_reuse if job.n_cache_reuse is None else job.n_cache_reuse
        if job.cache_prompt and not job.embed and n_reuse > 0 and self.can_shift:
            common = self._reuse_chunks(slot, prompt, common, n_reuse)
        if common == len(prompt):
            common -= 1  # decode the last prompt token again: its logits are needed
        if common < len(slot.cache):
            if not self.ctx.seq_rm(slot.id, common, -1):
                # a recurrent state cannot drop its last tokens (as in llama.cpp): start over
                self.ctx.seq_rm(slot.id, -1, -1)
                common = 0
            del slot.cache[common:]
        job.n_cached = common
        self.m["prompt_tokens_cached_total"] += common
        slot.pending = list(prompt[common:])
        slot.next_token = None
        slot.n_shifted = 0
        slot.out = StopText(self.vocab, job.stops)
        if job.progress:
            self._progress(job, common)
        # llama-server pushes the prompt into the sampler so repetition penalties see it
        if job.chain is not None and not job.embed:
            for t in prompt:
                job.chain.accept(int(t))

    def _reuse_chunks(self, slot: Slot, prompt: list, n_past: int, n_reuse: int) -> int:
        """llama-server's --cache-reuse: after the common prefix, walk the slot's cache for
        runs of at least ``n_reuse`` tokens that the prompt continues with, and move each
        run's cells down to where the prompt needs it (K re-roped by ``seq_add``); the
        cells skipped over are dropped. Returns the new number of cached prompt tokens."""
        cache = slot.cache
        head_c = head_p = n_past
        while head_c < len(cache) and head_p < len(prompt):
            n = 0
            while head_c + n < len(cache) and head_p + n < len(prompt) and cache[head_c + n] == prompt[head_p + n]:
                n += 1
            if n >= n_reuse:
                if head_p < head_c:
                    self.ctx.seq_rm(slot.id, head_p, head_c)
                    self.ctx.seq_add(slot.id, head_c, head_c + n, head_p - head_c)
                    cache[head_p:head_p + n] = cache[head_c:head_c + n]
                head_c += n
                head_p += n
                n_past += n
            else:
                head_c += 1
        return n_past

    def _progress(self, job: Job, processed: int) -> None:
        now = time.perf_counter()
        job.emit({"type": "progress", "total": len(job.prompt), "cache": job.n_cached, "processed": processed,
                  "time_ms": int((now - job.t_start) * 1e3),
                  "timings": _timings(job, now, processed) if job.timings_per_token else None})

    def _n_keep(self, job: Job) -> int:
        """Tokens a shift or truncation keeps: the request's n_keep, else --keep; -1 is the
        whole prompt; at most n_ctx_slot - 4 (llama-server's rules)."""
        n = self.config.n_keep if job.n_keep is None else job.n_keep
        if n < 0:
            n = len(job.prompt)
        return max(0, min(n, self.n_ctx_slot - 4))

    def _truncate(self, job: Job) -> list:
        """llama-server's prompt truncation under --context-shift: keep the first n_keep
        tokens and the last part, dropping whole blocks of (n_ctx_slot - n_keep) / 2."""
        prompt, n_keep = job.prompt, self._n_keep(job)
        n_block = max(1, (self.n_ctx_slot - n_keep) // 2)
        n_erase = (len(prompt) - n_keep - n_block) // n_block * n_block
        return prompt[:n_keep] + prompt[n_keep + n_erase:]

    # -- one step --------------------------------------------------------------------------

    def _room(self, slot: Slot, n: int) -> bool:
        """Whether ``slot`` can take ``n`` more cells (unified: counting every slot's cache,
        idle caches are dropped, least recently used first, to make room)."""
        if len(slot.cache) + n > self.n_ctx_slot:
            return False
        if not self.config.kv_unified:
            return True
        used = sum(len(s.cache) for s in self.slots) + self._reserved
        if used + n <= self.n_ctx:
            return True
        for s in sorted((s for s in self.slots if not s.busy and s.cache), key=lambda s: s.t_last):
            self.ctx.seq_rm(s.id, -1, -1)
            used -= len(s.cache)
            s.cache = []
            if used + n <= self.n_ctx:
                return True
        return False

    def _context_shift(self, slot: Slot) -> bool:
        """llama-server's context shift (generation.context_shift on the slot's sequence).
        False when it cannot free anything."""
        if not context_shift(self.ctx, slot.id, slot.cache, self._n_keep(slot.job), slot.job.n_discard):
            return False
        slot.n_shifted += 1
        return True

    def _step(self) -> None:
        for s in self.slots:
            if s.job is not None and s.job.cancelled:
                self.m["requests_cancelled"] += 1
                self._release(s)
        b = self._batch
        b.n_tokens = 0
        self._reserved = 0
        rows = []  # (batch index, slot)
        embeds = []  # (first batch index, n tokens, slot) of embedding inputs
        # 1. the generating slots' last sampled tokens
        for s in self.slots:
            if s.job is None or s.next_token is None:
                continue
            if not self._room(s, 1):
                if len(s.cache) + 1 > self.n_ctx_slot:
                    # only reachable with context shift on (otherwise _sample stopped at the limit)
                    if not (self.config.context_shift and self._context_shift(s)):
                        self._finish(s, "length", "limit", truncated=True)
                        continue
                else:  # the unified cache is full of other slots' tokens (llama-server: an error)
                    self._fail(s, "Context size has been exceeded.")
                    continue
            batch_add(b, s.next_token, len(s.cache), (s.id,), True)
            self._reserved += 1
            rows.append((b.n_tokens - 1, s))
        # 2. prompt chunks, in arrival order, while the batch has room
        for s in sorted((s for s in self.slots if s.job is not None and s.pending), key=lambda s: s.job.id):
            budget = self.n_batch - b.n_tokens
            if budget <= 0:
                break
            k = min(len(s.pending), budget)
            if s.job.embed and k < len(s.pending):
                continue  # an embedding input goes into one decode whole: wait for room in the batch
            if not self._room(s, k):
                if self.config.kv_unified and not any(x.busy and x.cache and x is not s for x in self.slots):
                    self._fail(s, f"the KV cache has no room for the prompt ({len(s.pending)} more tokens, "
                                  f"{self.n_ctx} cells)")
                continue  # wait for other slots to finish (unified cache)
            pos = len(s.cache)
            first = b.n_tokens
            for j in range(k):
                batch_add(b, s.pending[j], pos + j, (s.id,), s.job.embed or (j == k - 1 and k == len(s.pending)))
            self._reserved += k
            if s.job.embed:
                embeds.append((first, k, s))
            elif k == len(s.pending):
                rows.append((b.n_tokens - 1, s))
        if b.n_tokens == 0:
            if not any(s.busy for s in self.slots):
                return
            # every busy slot is waiting for room that cannot come: fail them rather than spin
            for s in self.slots:
                if s.busy:
                    self._fail(s, "the KV cache is full")
            return

        n = b.n_tokens
        tokens = b.token[:n].copy()
        seqs = b.seq_id[:n, 0].copy()
        n_prompt = n - sum(1 for _, s in rows if s.next_token is not None)
        t0 = time.perf_counter()
        try:
            self.ctx.decode(b)
        except Exception as e:
            msg = f"decode failed: {type(e).__name__}: {e}"
            log.error("%s", msg)
            for sid in set(int(x) for x in seqs):
                self._fail(self.slots[sid], msg)
            return
        dt = time.perf_counter() - t0
        self.m["n_decode_total"] += 1
        self.m["n_busy_slots_total"] += sum(1 for s in self.slots if s.busy)
        n_gen_rows = sum(1 for _, s in rows if s.next_token is not None)
        if n_prompt:
            self.m["prompt_tokens_total"] += n_prompt
            self.m["prompt_seconds_total"] += dt * n_prompt / n
        if n_gen_rows:
            self.m["tokens_predicted_seconds_total"] += dt * n_gen_rows / n

        # the cache now holds what was decoded
        toks = tokens.tolist()
        for sid in set(seqs.tolist()):
            s = self.slots[sid]
            mine = [t for t, q in zip(toks, seqs.tolist()) if q == sid]
            s.cache.extend(mine)
            if s.pending:
                del s.pending[:len(mine)]

        now = time.perf_counter()
        for sid in set(seqs.tolist()):
            s = self.slots[sid]
            if s.job is not None and s.job.progress and s.next_token is None and not s.job.embed \
                    and s.job.t_prompt_done == 0.0:
                self._progress(s.job, len(s.cache))
        for first, k, s in embeds:
            if s.job is not None:
                s.job.t_prompt_done = now
                self._finish_embed(s, first, k)
        for i, s in rows:
            job = s.job
            if job is None:
                continue
            if s.next_token is None:  # the prompt's last chunk
                job.t_prompt_done = now
            s.next_token = None
            if job.n_predict == 0:  # llama-server: n_predict 0 only caches the prompt
                self._finish(s, "length", "limit")
                continue
            try:
                self._sample(s, job, self.ctx.logits_ith(i))
            except Exception as e:  # this request's sampler (e.g. a grammar with no way on): only it fails
                log.warning("job %d: sampling failed: %s: %s", job.id, type(e).__name__, e)
                self._fail(s, f"sampling failed: {type(e).__name__}: {e}")
        self.m["n_tokens_max"] = max(self.m["n_tokens_max"], max(len(s.cache) for s in self.slots))

    def _sample(self, s: Slot, job: Job, row: np.ndarray) -> None:
        tok = int(job.sampler.sample(row))
        eog = bool(self.vocab.is_eog(tok))
        if eog and not job.ignore_eos:
            self._finish(s, "stop", "eos")
            return
        job.n_gen += 1
        self.m["tokens_predicted_total"] += 1
        lp = top = None
        prob = None
        if job.n_probs and job.post_sampling:
            prob, top = _post_sampling_probs(job, tok)
        elif job.n_probs:
            lps = Llama.logits_to_logprobs(row)
            lp = float(lps[tok])
            if job.n_probs > 0:
                k = min(job.n_probs, lps.shape[0])
                idx = np.argpartition(-lps, k - 1)[:k]
                idx = idx[np.lexsort((idx, -lps[idx]))]
                top = [(int(t), float(lps[t])) for t in idx]
        text = s.out.feed(tok)
        ev = {"type": "token", "token": tok, "text": text, "logprob": lp, "top": top}
        if job.post_sampling and job.n_probs:
            ev["prob"] = prob
        if job.timings_per_token:
            ev["timings"] = _timings(job, time.perf_counter())
        job.emit(ev)
        if s.out.stopped:
            self._finish(s, "stop", "word")
        elif self._line_limits(s, job, text):
            self._finish(s, "length", "limit")
        elif 0 <= job.n_predict <= job.n_gen:
            self._finish(s, "length", "limit")
        elif len(s.cache) + 1 >= self.n_ctx_slot and not self.config.context_shift:
            # prompt + generated tokens fill the slot: llama-server stops here, truncated
            self._finish(s, "length", "limit", truncated=True)
        else:
            s.next_token = tok

    def _line_limits(self, s: Slot, job: Job, text: str) -> bool:
        """llama-server's per-line stops, checked as it does (so they act one token late):
        once a new line has been sent, a line whose first non-blank character comes after
        fewer than ``n_indent`` spaces/tabs ends the text (that line's text is cut, its
        indentation kept); with ``t_max_predict_ms``, a new line after that much generating
        time stops."""
        stop = False
        if job.new_line and job.n_indent > 0:
            full = s.out.text
            if job.last_nl > 0:
                pos = job.last_nl
                while pos < len(full) and full[pos] in " \t":
                    pos += 1
                if pos < len(full) and pos - job.last_nl < job.n_indent:
                    s.out.truncate(pos)
                    stop = True
            nl = full.find("\n", job.last_nl)
            if nl != -1:
                job.last_nl = nl + 1
        if "\n" in text:
            job.new_line = True
            if job.t_max_predict_ms > 0 and (time.perf_counter() - job.t_prompt_done) * 1e3 > job.t_max_predict_ms:
                stop = True
        return stop

    def _finish(self, s: Slot, reason: str, stop_type: str, truncated: bool = False) -> None:
        job = s.job
        tail = s.out.finish() if s.out is not None else ""
        if tail:
            job.emit({"type": "token", "token": None, "text": tail, "logprob": None, "top": None})
        if s.out is not None and s.out.stopped and stop_type != "word":
            reason, stop_type = "stop", "word"
        job.t_end = time.perf_counter()
        if not job.t_prompt_done:
            job.t_prompt_done = job.t_end
        word = ""
        if stop_type == "word":
            word = s.out.stop_word
        job.done = True
        job.emit({"type": "done", "finish_reason": reason, "stop_type": stop_type, "stopping_word": word,
                  "text": s.out.text if s.out is not None else "", "n_prompt": len(job.prompt),
                  "n_cached": job.n_cached, "n_gen": job.n_gen, "timings": _timings(job),
                  "truncated": truncated or s.n_shifted > 0, "slot": s.id, "n_cache": len(s.cache),
                  "cut": bool(s.out is not None and s.out.cut)})
        self._release(s)

    def _finish_embed(self, s: Slot, first: int, k: int) -> None:
        from ..embedding import normalize

        job = s.job
        if self.pooling != 0:
            v = self.ctx.embeddings_seq(s.id)
            vecs = [normalize(v, job.normalize)]
        else:
            vecs = [normalize(self.ctx.embeddings_ith(first + j), job.normalize) for j in range(k)]
        job.t_end = time.perf_counter()
        job.done = True
        job.emit({"type": "done", "embedding": [x.tolist() for x in vecs], "n_prompt": len(job.prompt),
                  "n_cached": 0, "n_gen": 0, "finish_reason": "stop", "timings": _timings(job)})
        # the input's cells are of no use to a later request
        self.ctx.seq_rm(s.id, -1, -1)
        s.cache = []
        self._release(s)

    def _fail(self, s: Slot, message: str) -> None:
        job = s.job
        if job is not None and not job.done:
            job.done = True
            job.emit({"type": "error", "message": message})
        # the sequence may be half decoded: forget it
        try:
            self.ctx.seq_rm(s.id, -1, -1)
        except Exception:  # noqa: BLE001 (a dead context: nothing more to clean)
            pass
        s.cache = []
        self._release(s)

    def _release(self, s: Slot) -> None:
        if s.job is not None and not s.job.done:
            s.job.done = True
            s.job.t_end = time.perf_counter()
        s.job = None
        s.pending = []
        s.next_token = None
        s.out = None
        s.t_last = time.perf_counter()

    # -- introspection ---------------------------------------------------------------------

    def slots_info(self) -> list:
        out = []
        for s in self.slots:
            job = s.job
            out.append({"id": s.id, "n_ctx": self.n_ctx_slot, "is_processing": s.busy,
                        "id_task": job.id if job is not None else -1,
                        "n_past": len(s.cache), "n_prompt_pending": len(s.pending),
                        "n_decoded": job.n_gen if job is not None else 0})
        return out




def _post_sampling_probs(job: Job, tok: int):
    """llama-server's post_sampling_probs: the sampled token's probability and the top
    n_probs candidates by probability after the whole sampler chain (those with p = 0 left
    out), from the chain's final candidates."""
    cur = getattr(job.chain, "last", None)
    if cur is None or cur.p is None:
        return 0.0, []
    ids = np.asarray(cur.ids)
    p = np.asarray(cur.p, dtype=np.float32)
    order = np.argsort(-p, kind="stable")
    prob = 0.0
    hit = np.nonzero(ids == tok)[0]
    if hit.size:
        prob = float(p[hit[0]])
    top = []
    for i in order[:max(job.n_probs, 0)]:
        if p[i] == 0.0:
            break
        top.append((int(ids[i]), float(p[i])))
    return prob, top


def _timings(job: Job, now: Optional[float] = None, n_processed: Optional[int] = None) -> dict:
    """llama-server's timings of a job: at its end, or ``now`` while it runs (per-token
    timings; with ``n_processed``, the prompt's progress so far: its tokens decoded and
    the time since it started, nothing generated yet)."""
    n_p = len(job.prompt) - job.n_cached
    if n_processed is not None:
        n_p = max(n_processed - job.n_cached, 0)
        t_p = max(now - job.t_start, 0.0) * 1e3 if n_p else 0.0
        t_g = 0.0
    else:
        t_p = max(job.t_prompt_done - job.t_start, 0.0) * 1e3
        t_g = max((now if now is not None else job.t_end) - job.t_prompt_done, 0.0) * 1e3
    return {"cache_n": job.n_cached, "prompt_n": n_p, "prompt_ms": t_p,
            "prompt_per_token_ms": t_p / n_p if n_p else 0.0,
            "prompt_per_second": 1e3 * n_p / t_p if t_p > 0 else 0.0,
            # the first generated token comes from the prompt's decode: rates are over the
            # n_gen - 1 decodes after it (llama-server's)
            "predicted_n": job.n_gen, "predicted_ms": t_g,
            "predicted_per_token_ms": t_g / (job.n_gen - 1) if job.n_gen > 1 else 0.0,
            "predicted_per_second": 1e3 * (job.n_gen - 1) / t_g if job.n_gen > 1 and t_g > 0 else 0.0}

