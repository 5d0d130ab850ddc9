"""Rank 0 of a group: it owns the engine core and the task and admin sockets, and publishes each
step's plan to its tensor-parallel peers. It *has* an intake, an admin handler, a weights
coordinator, metrics and a link to its peers; each gets a narrow handle, not the driver."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import zmq

from aioworker.core.engine_core import EngineCore
from aioworker.core.executor import Executor
from aioworker.core.expert_load import ExpertLoad, summary
from aioworker.core.loaded_rank import LoadedRank
from aioworker.runtime.admin import AdminHandler
from aioworker.runtime.group_control import GroupControl
from aioworker.runtime.heartbeat import ServingInfo, expert_info, host_kv_info, weights_info
from aioworker.runtime.hung import watch_for_hung_steps
from aioworker.runtime.intake import RequestIntake
from aioworker.runtime.lifecycle import FatalError
from aioworker.runtime.metrics import WorkerMetrics
from aioworker.runtime.open_requests import OpenRequests
from aioworker.runtime.peer_group import PeerGroup
from aioworker.runtime.rank import Rank
from aioworker.runtime.recorder import Recorder
from aioworker.runtime.reply_policy import ReplyPolicy
from aioworker.runtime.results import ResultSender
from aioworker.runtime.state import ExitCode
from aioworker.runtime.stats import RecentMean
from aioworker.runtime.weights import WeightsCoordinator
from aioworker.wire.drops import DropCounter
from aioworker.wire.health import RankState, beat_expert_load
from aioworker.wire.security import Role

log = logging.getLogger(__name__)


class Driver:
    def __init__(self, rank: Rank) -> None:
        self.rank = rank
        self.config = rank.config
        self.loaded: LoadedRank | None = None
        self.core: EngineCore | None = None
        self.control: GroupControl | None = None
        self.requests: OpenRequests | None = None
        self.weights: WeightsCoordinator | None = None
        self.metrics: WorkerMetrics | None = None
        self.rejected = DropCounter(log, "malformed frames")
        # Made in bind(); close() may run without them when start-up failed first.
        self.results: ResultSender | None = None
        self.recorder: Recorder | None = None
        self.peers: PeerGroup | None = None
        self.admin: AdminHandler | None = None
        # The loop's own time per step (scheduling, plan publishing, outputs), not the model's.
        self.loop_time = RecentMean()
        self.loop_cpu_time = RecentMean()  # the same, in this thread's CPU time

    # -- the rank role ------------------------------------------------------------------------

    def bind(self) -> None:
        rank, runtime = self.rank, self.config.runtime
        security = rank.security
        tasks, admin = rank.endpoints.tasks, rank.endpoints.admin
        self.tasks = rank.socket(
            zmq.PULL, bind=tasks, options=security.server_options(tasks, Role.CLIENTS)
        )
        admin_socket = rank.socket(
            zmq.ROUTER,
            bind=admin,
            options=security.server_options(admin, Role.ADMIN),
            max_message_bytes=runtime.max_admin_message_bytes,
        )
        self.results = ResultSender(
            runtime.result_hwm,
            security.result_options,
            runtime.max_client_sockets,
            runtime.client_timeout_s,
        )
        self.recorder = Recorder(runtime.record_path) if runtime.record_path else None
        self.results.recorder = self.recorder
        self.peers = PeerGroup(rank, self.rejected)
        self.admin = AdminHandler(
            admin_socket,
            self.status,
            rank.spawn,
            self.rejected,
            runtime.drain_timeout_s,
            rank.beat_published,
        )
        rank.spawn(self.admin.loop())  # status answers while loading

    async def serve(self, executor: Executor, loaded: LoadedRank) -> None:
        rank, runtime = self.rank, self.config.runtime
        self.loaded = loaded
        num_blocks = await self.peers.wait_until_ready(loaded.num_blocks)
        self.core = EngineCore(
            executor,
            loaded,
            self.config.scheduler,
            num_blocks,
            self.config.cache.enable_prefix_caching,
            self.config.speculative,
            self.config.guided.fill_threads,
            self.config.cache.preemption,
        )
        if runtime.metrics_port:
            port = runtime.metrics_port + rank.group
            self.metrics = WorkerMetrics(
                rank.group, port, runtime.host, self.serving_info, self.weights_per_rank(),
                self.expert_loads,
            )  # fmt: skip
        requests = OpenRequests(self.core, self.results, rank.group, self.metrics)
        self.control = GroupControl(rank.lifecycle, self.core, requests)
        # A grammar compiled on its pool's thread: its request may run now.
        loop, wake = asyncio.get_running_loop(), self.control.wake
        self.core.guided.on_ready = lambda: loop.call_soon_threadsafe(wake)
        requests.on_all_ended = self.control.finish_drain_if_done
        self.requests = requests
        self.weights = WeightsCoordinator(self.control, requests, self.peers)
        self.admin.serve_group(self.control, requests, self.weights)
        intake = RequestIntake(
            self.tasks,
            self.control,
            requests,
            self.results,
            self.rejected,
            runtime,
            ReplyPolicy(self.config),
            self.recorder,
        )
        rank.lifecycle.move(RankState.READY)
        log.info(
            "group %d ready: %d KV blocks of %d tokens", rank.group, num_blocks, loaded.block_size
        )
        rank.spawn(intake.loop())
        rank.spawn(self.results.run(self._on_client_gone))
        rank.spawn(self.step_loop())
        rank.spawn(watch_for_hung_steps(rank.progress))
        self.peers.serve()

    async def close(self) -> None:
        lifecycle = self.rank.lifecycle
        if self.control is not None:
            self.control.close()
            if lifecycle.state is RankState.FAILED:
                self.requests.fail_all(f"worker failed: {lifecycle.detail}")
            else:
                self.requests.abort_all("worker shutting down")
        failed = lifecycle.state is RankState.FAILED
        if self.admin is not None:
            await self.admin.close(f"worker {'failed' if failed else 'shutting down'}")
        if self.peers is not None:
            await self.peers.send_shutdown(lifecycle.detail or "driver stopped", failed)
        if self.results is not None:
            self.results.close()
        if self.recorder is not None:
            self.recorder.close()
        if self.core is not None:
            self.core.close()  # grammar threads

    def serving_info(self) -> ServingInfo:
        if self.core is None:
            if self.loaded is None:
                return ServingInfo()
            return ServingInfo(
                kv_blocks_total=self.loaded.num_blocks,
                max_model_len=self.loaded.max_model_len,
                **weights_info(self.loaded),
                **expert_info(self.loaded),
            )
        scheduler = self.core.scheduler
        blocks = scheduler.block_manager
        policy = scheduler.speculator.policy if scheduler.speculator is not None else None
        return ServingInfo(
            len(scheduler.running),
            len(scheduler.waiting),
            blocks.num_used_blocks,
            blocks.num_blocks,
            self.core.weights_version,
            blocks.num_cached_blocks,
            blocks.num_hit_tokens,
            blocks.num_queried_tokens,
            self.loaded.max_model_len,
            *((policy.num_proposed, policy.num_accepted, policy.num_verified) if policy else ()),
            **weights_info(self.loaded),
            **expert_info(self.loaded),
            **scheduler.connector.stats(),
        )

    def host_kv_status(self, info: ServingInfo) -> dict[str, Any]:
        """The host KV tier's figures, with its free blocks; none without a tier."""
        if not info.host_kv_blocks_total:
            return {}
        return {
            "host_kv_blocks_total": info.host_kv_blocks_total,
            "host_kv_blocks_used": info.host_kv_blocks_used,
            "host_kv_blocks_free": info.host_kv_blocks_total - info.host_kv_blocks_used,
            **host_kv_info(info),  # the rest after them: keys already set keep their place
        }

    def guided_status(self) -> dict[str, Any]:
        """Guided decoding: requests whose grammar compiles now, grammars that failed to compile,
        and the compiled-grammar cache (compiles, hits, bytes held)."""
        core = self.core
        if core is None or core.guided.backend is None:
            return {}
        backend = core.guided.backend
        return {
            "guided_compiling": core.guided.num_compiling,
            "guided_refused": core.guided.num_refused,
            "grammars_compiled": backend.num_compiled,
            "grammar_cache_hits": backend.num_cache_hits,
            "grammar_cache_bytes": backend.cached_bytes,
        }

    def weights_per_rank(self) -> list[dict[str, Any]]:
        """Each loaded rank's quantization and weight bytes: the driver's own, then its peers'
        (from their PeerReady)."""
        own = [(0, self.loaded)] if self.loaded is not None else []
        peers = sorted(self.peers.ready.items()) if self.peers is not None else []
        return [{"rank": rank, **weights_info(facts)} for rank, facts in own + peers]

    def expert_loads(self) -> dict[int, ExpertLoad]:
        """Each rank's latest expert load (MoE models): the driver's own, its peers' from their
        last beats; empty for a dense model."""
        if self.loaded is None or self.loaded.expert_load is None:
            return {}
        loads = {0: self.loaded.expert_load()}
        if self.peers is not None and self.peers.liveness is not None:
            beats = dict(self.peers.liveness.last_beats)  # one copy: the metrics thread reads too
            loads |= {rank: beat_expert_load(beat) for rank, beat in beats.items()}
        return dict(sorted(loads.items()))

    def expert_status(self) -> dict[str, Any]:
        loads = self.expert_loads()
        if not loads:
            return {}
        return {
            "expert_layout": loads[0].layout,
            "expert_parallel_size": self.config.parallel.expert_parallel_size,
            "expert_load_per_rank": [{"rank": r, **summary(load)} for r, load in loads.items()],
        }

    def _on_client_gone(self, client) -> None:
        reason = "the client is gone, or has read none of its outputs for a long time"
        count = self.requests.abort_client(client, reason)
        if count:
            log.warning("aborted %d request(s) of %s: %s", count, client[0], reason)

    def on_stop_signal(self) -> None:
        """SIGTERM / SIGINT: drain when serving, otherwise stop now."""
        if self.control is not None and not self.rank.lifecycle.state.is_final:
            self.control.start_drain(self.config.runtime.drain_timeout_s)
        else:
            self.rank.lifecycle.stop()

    # -- steps --------------------------------------------------------------------------------

    async def step_loop(self) -> None:
        """Keep up to MAX_IN_FLIGHT steps launched: the next plan is built and queued on the
        device while the current step runs, then the oldest step's tokens are delivered."""
        core, control, requests = self.core, self.control, self.requests
        progress = self.rank.progress
        in_flight, publish = core.in_flight, self.peers.publish_plan
        while True:
            started, started_cpu = time.perf_counter(), time.thread_time()
            if control.can_step():
                core.launch(publish)
                if core.guided:
                    requests.deliver(core.take_refused())  # grammars that failed to compile
            launched, launched_cpu = time.perf_counter(), time.thread_time()
            if not in_flight:
                control.progress.set()
                control.work.clear()
                await control.work.wait()
                continue
            step = in_flight[0]
            progress.step_id, progress.started_at = step.plan.step_id, step.submitted_at
            try:
                result = await asyncio.wrap_future(step.future)
            except Exception as exc:
                reason = f"step {step.plan.step_id} failed: {type(exc).__name__}: {exc}"
                requests.fail_all(reason)
                raise FatalError(ExitCode.FAILED, reason) from exc
            outputs = core.complete(result)
            progress.started_at = in_flight[0].submitted_at if in_flight else None
            returned, returned_cpu = time.perf_counter(), time.thread_time()
            requests.deliver(outputs)
            progress.num_tokens_generated += len(outputs)
            if self.metrics is not None:
                self.metrics.on_step(len(outputs))
            control.finish_drain_if_done()
            control.progress.set()
            self.loop_time.add(launched - started + time.perf_counter() - returned)
            self.loop_cpu_time.add(launched_cpu - started_cpu + time.thread_time() - returned_cpu)

    # -- status -------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        rank, lifecycle = self.rank, self.rank.lifecycle
        info = self.serving_info()
        return {
            "group": rank.group,
            "state": str(lifecycle.state),
            "detail": lifecycle.detail,
            "step_id": rank.progress.step_id,
            "num_running": info.num_running,
            "num_waiting": info.num_waiting,
            "kv_blocks_used": info.kv_blocks_used,
            "kv_blocks_total": info.kv_blocks_total,
            "kv_blocks_cached": info.kv_blocks_cached,
            "prefix_hit_tokens": info.prefix_hit_tokens,
            "prefix_queried_tokens": info.prefix_queried_tokens,
            "prefix_hit_rate": round(
                info.prefix_hit_tokens / max(1, info.prefix_queried_tokens), 4
            ),
            **self.host_kv_status(info),
            "spec_draft_tokens": info.spec_draft_tokens,
            "spec_accepted_tokens": info.spec_accepted_tokens,
            "spec_acceptance_rate": round(
                info.spec_accepted_tokens / max(1, info.spec_draft_tokens), 4
            ),
            "spec_mean_accepted_length": round(
                1 + info.spec_accepted_tokens / info.spec_verified if info.spec_verified else 0, 3
            ),
            "num_requests": len(self.requests) if self.requests is not None else 0,
            "num_tokens_generated": rank.progress.num_tokens_generated,
            "num_rejected_frames": self.rejected.total,
            "num_dropped_outputs": self.results.drops.total if self.results else 0,
            "num_unsent_control": self.peers.unsent.total if self.peers else 0,
            "loop_us_per_step": round(self.loop_time.mean * 1e6, 1),
            "loop_cpu_us_per_step": round(self.loop_cpu_time.mean * 1e6, 1),
            **self.guided_status(),
            "weights_version": info.weights_version,
            "last_weights_update_s": self.weights.last_update_s if self.weights else None,
            "weights_per_rank": self.weights_per_rank(),
            "tensor_parallel_size": self.config.parallel.tensor_parallel_size,
            **self.expert_status(),
            "model": str(self.loaded.model_dir) if self.loaded else None,
        }
