"""Messages between workers and the controller.

They travel pickled over an authenticated ``multiprocessing.connection`` (HMAC challenge
with the per-run secret). Worker -> controller messages carry the sender's rank; the
controller answers checkpoint reports by report index.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cairn._src.checkpoint.views import CheckpointView
from cairn._src.storage.checksum import WrittenFile
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.transfer import FileEntry
from cairn._src.storage.tuning import TransferConfig

# The most bytes of small files one rank sends the driver per checkpoint
# (UploadedMessage.small_files), and the most a run's ranks send together.
DRIVER_COPY_RANK_BYTES = 1 << 20
DRIVER_COPY_RUN_BYTES = 64 << 20


def driver_copy_limit(world_size: int) -> int:
    """How many bytes of small files each of ``world_size`` ranks sends the driver."""
    return min(DRIVER_COPY_RANK_BYTES, DRIVER_COPY_RUN_BYTES // max(1, world_size))


def driver_copy_cost(name: str, size: int) -> int:
    """What one small file of ``size`` bytes under ``name`` counts against that limit:
    its name and a fixed cost too, so that many empty files cannot exceed it."""
    return size + len(name) + 64


# --- worker -> controller ----------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointIntent:
    """What a rank will contribute to the checkpoint of one report.

    For an upload: the relative paths and sizes it will write under ``dir_name``. For a
    reference (NO_UPLOAD, or ``checkpoint_upload_fn``), ``reference`` is where the data is.
    """

    dir_name: str
    mode: str
    files: dict[str, int] = field(default_factory=dict)
    reference: StorageLocation | None = None
    explicit_dir_name: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    upload_fn: bool = False
    # report(validation=...): the JSON task ({} for the trainer's defaults), or None.
    validation: dict[str, Any] | None = None
    # Which directory of which machine the files are read from (local_dir_identity): ranks
    # that report one shared directory give the same value, and it is uploaded once.
    source: str | None = None
    # Of a NO_UPLOAD reference: what this rank's writer computed while writing its files
    # (relpath -> WrittenFile; cairn.torch.FileSystemWriter), checked and taken at commit.
    written: dict[str, WrittenFile] = field(default_factory=dict)


@dataclass(frozen=True)
class ReportMessage:
    """A rank's n-th ``report()``.

    ``dir_name`` is the ``checkpoint_dir_name`` a rank gave without a checkpoint of its own
    (another rank passes the checkpoint, as in Ray Train): it must match that checkpoint's.
    """

    rank: int
    index: int
    metrics: dict[str, Any]
    checkpoint: CheckpointIntent | None
    sent_at: float
    dir_name: str | None = None


@dataclass(frozen=True)
class UploadedMessage:
    """A rank finished writing its files (or registering its reference) for a report.

    ``duplicates`` holds the size and checksum of this rank's own copy of each path that
    another rank uploads (the verdict's ``duplicates``): it was not uploaded, and the
    commit compares it with the uploaded copy.
    """

    rank: int
    index: int
    entries: dict[str, FileEntry]
    reference: StorageLocation | None
    bytes_written: int
    seconds: float
    duplicates: dict[str, FileEntry] = field(default_factory=dict)
    # Of a reference returned by checkpoint_upload_fn: as CheckpointIntent.written.
    written: dict[str, WrittenFile] = field(default_factory=dict)
    # Files listed at report() that were gone when this first upload of the directory
    # read them (another rank reporting it too may have renamed them): unless such a
    # rank's upload replaces this one, the controller fails the upload as it says.
    vanished: VanishedFiles | None = None
    # With keep_survivors: the bytes of this rank's smallest written files, up to
    # driver_copy_limit(world size) in all, which the driver keeps for a replacement of
    # this rank (controller/driver_copies.py).
    small_files: dict[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class ReportedCheckpointsRequest:
    """``get_all_reported_checkpoints()``: answer once reports up to ``index`` are resolved
    (``consistency_mode`` "COMMITTED" or "VALIDATED"), or at ``timeout_s``."""

    rank: int
    request_id: int
    index: int
    consistency_mode: str
    timeout_s: float | None


@dataclass(frozen=True)
class UploadFailedMessage:
    rank: int
    index: int
    error: str


@dataclass(frozen=True)
class VanishedFiles:
    """Files of a rank's upload gone before it read them (:attr:`UploadedMessage.vanished`),
    and how that upload fails unless another rank's upload of the directory replaces it:
    ``failed`` as an upload failure (under the run's ``upload_failure_policy``), after
    ``fatal`` when it is a mistake a restart would repeat (an ASYNC directory)."""

    paths: tuple[str, ...]
    failed: UploadFailedMessage
    fatal: ErrorMessage | None = None


@dataclass(frozen=True)
class TimingMessage:
    """Time a rank spent blocked (``kind``: report, checkpoint_stall, restore ...)."""

    rank: int
    kind: str
    seconds: float
    at: float
    index: int | None = None


@dataclass(frozen=True)
class DoneMessage:
    rank: int
    report_count: int
    return_value: bytes | None


@dataclass(frozen=True)
class ErrorMessage:
    rank: int
    error_type: str
    message: str
    traceback: str
    exception: bytes | None
    fatal: bool
    # The failing frame in the user's code: {"file", "line", "function"} (see
    # code_locations.failing_frame), or None.
    frame: dict[str, Any] | None = None


# --- controller -> worker ----------------------------------------------------------------


@dataclass(frozen=True)
class SetupMessage:
    """Everything a worker needs to run its share of an attempt."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    attempt: int
    experiment_name: str
    run: StorageLocation
    train_fn: bytes
    config: bytes
    pass_config: bool
    resume: CheckpointView | None
    first_report_index: int
    score_attribute: str | None
    max_pending_uploads: int
    upload_failure_policy: str
    retry: bytes
    setup_hooks: bytes
    teardown_hooks: bytes
    # Whether the trainer has a ValidationConfig (report(validation=...) is refused if not).
    validation: bool = False
    # The token of the storage check marker the driver wrote (storage_check), or None.
    storage_token: str | None = None
    # Trainer(datasets=...): the names, and this rank's pickled {name: DataIterator}.
    dataset_names: tuple[str, ...] = ()
    dataset_shards: bytes | None = None
    # CheckpointConfig.local_tier_bytes and local_tier_dir (0: no local tier).
    local_tier_bytes: int = 0
    local_tier_dir: str | None = None
    # RunConfig.storage_transfer (None: the worker keeps its process default).
    transfer: TransferConfig | None = None
    # FailureConfig.keep_survivors: after its train function ends by an error or a stop,
    # the worker waits for a RejoinMessage instead of exiting.
    keep_survivors: bool = False
    # RunConfig.storage_fsync: uploaded files are fsynced before they are announced.
    fsync: bool = True
    # keep_survivors: where this rank restores the checkpoint it resumes from (None: storage).
    restore: RestorePlan | None = None


@dataclass(frozen=True)
class ProceedMessage:
    """The controller accepted a rank's checkpoint intent: upload now.

    ``duplicates`` are paths that another rank of the same report uploads: this rank does
    not upload them, it sends its own size and checksum of each instead (identical copies
    are stored once). ``shared`` is "" (upload the files listed at report time), "upload"
    (other ranks reported this same directory and every rank has reported: list it again
    now and upload it whole, except ``duplicates``; of ``stale``, what an earlier upload
    of it wrote (path -> entry), a file the directory still holds with the same size and
    checksum is not written again, and one it no longer holds is deleted) or "skip"
    (another rank uploads this directory; upload nothing).
    """

    index: int
    duplicates: tuple[str, ...] = ()
    shared: str = ""
    stale: dict[str, FileEntry] = field(default_factory=dict)


@dataclass(frozen=True)
class RejectMessage:
    """The controller refused a checkpoint report; ``error`` is raised in the worker."""

    index: int
    error: BaseException


@dataclass(frozen=True)
class CommittedMessage:
    index: int
    checkpoint: CheckpointView | None
    error: str | None = None
    skipped: bool = False


@dataclass(frozen=True)
class ReportedCheckpointsReply:
    """The run's kept checkpoints, each with its status name (ReportedCheckpointStatus)."""

    request_id: int
    checkpoints: tuple[tuple[CheckpointView, str], ...]


BARRIER = "barrier"


BROADCAST = "broadcast_from_rank_zero"


@dataclass(frozen=True)
class CollectiveMessage:
    """Worker -> controller: ``rank`` reached its ``seq``-th collective call.

    ``reports`` is the number of ``report()`` calls the rank made before it; ``data`` is
    the pickled payload (rank 0 of a broadcast only).
    """

    rank: int
    seq: int
    kind: str
    reports: int
    data: bytes | None = None


@dataclass(frozen=True)
class CollectiveReleaseMessage:
    """Controller -> worker: every rank reached collective ``seq``; ``data`` is rank 0's."""

    seq: int
    data: bytes | None = None


# --- keeping the survivors of a failure (FailureConfig(keep_survivors=True)) -------------


@dataclass(frozen=True)
class StopMessage:
    """Controller -> worker: another rank failed; stop the train function.

    The worker raises :class:`AttemptStopped` at the train function's next ``report()``
    or collective (and in those already waiting), ends its process group, waits for its
    uploads, then answers :class:`StoppedMessage` and waits for a :class:`RejoinMessage`.
    """

    attempt: int
    reason: str


@dataclass(frozen=True)
class StoppedMessage:
    """Worker -> controller: the train function of ``attempt`` has ended (it raised, or
    was stopped), Cairn's own threads are idle, and the process waits to rejoin."""

    rank: int
    attempt: int
    # The committed checkpoint this rank holds in memory (its last snapshot), if any.
    memory_copy: MemoryCopyInfo | None = None


@dataclass(frozen=True)
class MemoryCopyInfo:
    """A kept rank's copy in memory of the committed checkpoint of report
    ``report_index``; ``address``: where it serves the copy to a replacement rank (an
    authenticated socket, the run's secret), None where it does not. ``pending``: the
    reports it also holds a copy of whose commit it had not heard of when it stopped (one
    of them may commit before the next attempt starts)."""

    report_index: int
    address: tuple[str, int] | None = None
    pending: tuple[int, ...] = ()

    def holds(self, report_index: int) -> bool:
        """Whether the rank holds a copy of ``report_index`` (committed by now)."""
        return report_index == self.report_index or report_index in self.pending


@dataclass(frozen=True)
class RestorePlan:
    """The driver's choice of the copies a rank restores the checkpoint of
    ``report_index`` from: its own memory copy (``own_memory``) and then the copies of
    ``peers`` (rank, host, port), then ``driver_files``: the bytes of small files this
    rank wrote for that checkpoint, which the driver kept (``UploadedMessage.small_files``);
    each is used only when its size and checksum are the manifest's. What none of them
    holds verified comes from storage. ``reason`` says why (for the event log)."""

    report_index: int
    own_memory: bool
    peers: tuple[tuple[int, str, int], ...] = ()
    reason: str = ""
    driver_files: dict[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class RestoredMessage:
    """Worker -> controller: where the files of the checkpoint of ``report_index`` that
    this rank restored came from (bytes from its memory, from a peer, from storage; or,
    when none of them held a file, this node's local tier: ``source`` "local tier", no
    storage bytes), and why storage was read (``reason``, "" when it was not)."""

    rank: int
    report_index: int
    source: str
    reason: str
    memory_bytes: int
    peer_bytes: int
    storage_bytes: int
    seconds: float
    # The peer that supplied most of the peer bytes the restore used.
    peer_rank: int | None = None
    # The peers' files were fetched from the attempt's start, beside the train function
    # (see worker/peer_prefetch.py); ``seconds`` then counts from that start.
    prefetched: bool = False
    # Bytes of files the driver kept (RestorePlan.driver_files).
    driver_bytes: int = 0


@dataclass(frozen=True)
class RejoinMessage:
    """Controller -> a kept worker: connect again and run the train function for
    ``attempt``; ``env`` are that attempt's variables (the torch rendezvous port)."""

    attempt: int
    env: dict[str, str] = field(default_factory=dict)
