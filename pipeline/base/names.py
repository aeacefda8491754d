"""Names, defined once: the metrics, tags and artifacts a run carries, the local files beside a store,
and the longest experiment name MLflow takes.

Every module that writes or reads MLflow data spells a name through these constants, so the UI, the
comparison and the registry always agree on what a run holds.
"""

from __future__ import annotations

# Per-epoch metrics use step = epoch (from 1).
EPOCH_METRICS = (
    "train_loss",
    "train_accuracy",
    "test_loss",
    "test_accuracy",
    "epoch_duration_s",
    "images_per_s",
    "data_time_s",
    "transfer_time_s",
    "compute_time_s",
    "enqueue_time_s",
    "peak_memory_mb",
    "energy_j",
)
TIME_BUCKETS = ("data_time_s", "transfer_time_s", "compute_time_s")  # together: the epoch
RUN_DURATION = "run_duration_s"
WARMUP = "warmup_s"  # the untimed warm-up before epoch 1 (run-level, step 0)
UPLOAD = "upload_s"  # data_on_device: uploading the training data to the device, once (step 0)
CAPTURE = "capture_s"  # cuda_graph: warming up and capturing the training step, once (step 0)
COMPILE = "compile_s"  # compile: the warm-up that compiles the model at every shape the run uses (step 0)
MODEL_NAME = "model"
# Time to a target quality (a grid's `target:`), run-level at the step of the first epoch that reaches it.
TIME_TO_TARGET = "time_to_target_s"  # the training passes to that epoch: evaluation and one-off costs left out
WALL_TO_TARGET = "wall_to_target_s"  # the wall clock from the fit's start to the end of that epoch's evaluation
# How busy the machine was while a run trained (run-level, step 0).
LOAD_AVERAGE = "load_average"  # the 1-minute load average over the training, per core
OTHERS_CPU_SHARE = "others_cpu_share"  # the share of all cores other processes took, 0-1
# Each child's steady-state summary (run-level, step 0), rounded as a person reads them: the figures
# the terminal, `pipeline compare`, the parent's description, the charts and the UI's view all show.
STEADY_EPOCH = "steady_epoch_s"  # the median of the steady-state epochs' epoch_duration_s, 4 significant digits
STEADY_IMAGES = "steady_images_per_s"  # the images of an epoch over STEADY_EPOCH, whole images
FINAL_ACCURACY = "final_test_accuracy"  # test accuracy after the last epoch, 4 digits
# Each child of a sweep, once the sweep is compared (run-level, step 0): its place in the verdict's
# order, which the UI's view sorts by: 1 is the run whose model the verdict names (compare.pick),
# then every setting fastest first, each setting's runs most accurate first.
RANK = "rank"
# Each child of a sweep, once the sweep is published (run-level, step 0): its setting's figures, the
# same numbers as `pipeline compare`'s row for the setting (medians over its counted runs), so that
# every run's row in the UI shows its setting's figures; the first columns of the sweep's view.
SETTING_STEADY_EPOCH = "setting_steady_epoch_s"
SETTING_IMAGES = "setting_images_per_s"
SETTING_ACCURACY = "setting_final_test_accuracy"
SETTING_TO_TARGET = "setting_time_to_target_s"  # only for a setting that ranks on the target
SETTING_RUNS = "setting_n"  # how many runs the setting has (its speed figures count the timed ones among them)
# Each child's end figures (run-level, step 0), beside its summary: with it, every per-run
# figure a comparison row needs, so that a comparison reads no history (records.read_sweep, timing.end_figures).
TRAINED_EPOCHS = "trained_epochs"  # how many epochs the run holds; every run that logs the end figures has it
FIRST_EPOCH = "first_epoch_s"  # epoch 1's epoch_duration_s (cold)
TIME_SHARES = ("data_share", "transfer_share", "compute_share")  # each TIME_BUCKETS' share of the steady epochs
PEAK_MEMORY = "run_peak_memory_mb"  # the highest of the epochs' peak_memory_mb
STEADY_ENERGY = "steady_energy_j"  # the mean of the steady epochs' energy_j (0 where the counter never moved)
END_FIGURES = (TRAINED_EPOCHS, FIRST_EPOCH, *TIME_SHARES, PEAK_MEMORY, STEADY_ENERGY)
# Each child's arithmetic and its share of the device's peak (run-level, step 0; flops.py, peak.py).
TRAIN_FLOPS = "train_flops_per_epoch"  # FLOPs of a training epoch (forward, loss, backward), as torch counts them
ACHIEVED_TFLOPS = "achieved_tflops"  # TRAIN_FLOPS over the steady-state epoch (its median), in TFLOP/s
PEAK_TFLOPS = "peak_tflops"  # the device's measured matmul peak at the run's precision, in TFLOP/s
MFU = "mfu"  # ACHIEVED_TFLOPS / PEAK_TFLOPS, in (0, 1]; absent where it cannot be told (TAG_PEAK says why)
TRAIN_BYTES = "train_bytes_per_epoch"  # bytes a training epoch's eager kernels read and write, unfused: an upper bound
PEAK_BANDWIDTH = "peak_bandwidth_gbs"  # the device's measured copy bandwidth (read + written), in GB/s
# TRAIN_BYTES over the steady-state epoch, over PEAK_BANDWIDTH, in (0, 1]: only on CUDA with compile off
# (peak.bandwidth_share); absent elsewhere (TAG_BANDWIDTH says why)
BANDWIDTH_SHARE = "bandwidth_share"
REPEAT = "repeat"  # param: which repeat of its point a run is (1-based), with a grid's `repeats: N`
# A sweep's parent run once its children are done (run-level, step 0): the answer at a glance, over
# the children it trained that FINISHED. Its params are the grid's axes ("1000,10000"), repeats, target.
BEST_STEADY_EPOCH = "best_steady_epoch_s"  # the lowest setting's steady_epoch_s (its median over its runs)
BEST_FINAL_ACCURACY = "best_final_test_accuracy"  # the highest setting's final_test_accuracy (median)
FINISHED_RUNS = "finished_runs"  # how many children FINISHED
ROUNDS = "rounds"  # `repeats: auto`: the rounds the sweep reached (each point's runs, DONE ones included)

# Statuses MLflow stores (a run's end).
FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"

TAG_PARENT_RUN = "mlflow.parentRunId"  # MLflow's own (mlflow.utils.mlflow_tags.MLFLOW_PARENT_RUN_ID)
TAG_DEVICE = "pipeline.device"
TAG_HARDWARE = "pipeline.hardware"
TAG_TORCH = "pipeline.torch_version"
TAG_CUDA = "pipeline.cuda_version"
TAG_CONFIG_HASH = "pipeline.config_hash"
TAG_DATA = "pipeline.data"
TAG_ENERGY = "pipeline.energy"  # where energy_j comes from, or why there is none
TAG_ERROR = "pipeline.error"
TAG_PARAM_DEVICES = "pipeline.param_devices"  # where every parameter lives after the move
TAG_GRID_FILE = "pipeline.grid_file"
TAG_GRID_SIZE = "pipeline.grid_size"
TAG_OVERRIDES = "pipeline.overrides"  # a sweep's `--set KEY=VALUE` items, e.g. "--set epochs=1 --set device=cpu"
TAG_OPTIONS = "pipeline.options"  # a sweep's options, e.g. "--system-metrics --register fashion-cnn"
TAG_ROLE = "pipeline.role"  # "sweep" (a parent) or "point" (one grid point) or "single"
TAG_VERDICT = "pipeline.verdict"  # a published sweep's child: its setting's part of the verdict (sentences.claims)
# a published sweep's child: its setting's name ("cpu bs128 w0"), which the view groups by
TAG_SETTING = "pipeline.setting"
TAG_RUN_KEY = "pipeline.run_key"  # settings + data + host + hardware: what "already done" means
TAG_CLAIM = "pipeline.claim"  # the attempt at its point the run's process claimed (tracking/claims.py)
TAG_CLAIM_SWEEP = "pipeline.claim_sweep"  # on a claim: the parent run of the sweep that holds it
TAG_CREATE_TOKEN = "pipeline.create_token"  # unique per created run: a retried create finds it
TAG_THREADS = "pipeline.torch_threads"  # torch's intra-op threads the run trained with (train.torch_threads)
TAG_HOST = "pipeline.host"  # the machine whose process ran the run (on Ray: the node's)
TAG_RAY_NODE = "pipeline.ray_node_id"  # the Ray node a point's task ran on
TAG_PID = "pipeline.pid"
TAG_PROCESS_START = "pipeline.process_start"  # with the pid, tells a live process from a reused pid
TAG_RESUMED_FROM = "pipeline.resumed_from_epoch"
TAG_RESUMED_FROM_RUN = "pipeline.resumed_from_run"
TAG_KILLED_REASON = "pipeline.killed_reason"
# Set last, once a run's summary and model are logged: only such a run is done (records.finished_by_key).
TAG_COMPLETE = "pipeline.complete"
TAG_RELOGGED = "pipeline.relogged_from"  # the results file a run's numbers were restored from
TAG_TARGET = "pipeline.target"  # the target a run was timed against, e.g. "test_accuracy >= 0.85"
TAG_TARGET_STATUS = "pipeline.target_status"  # "reached at epoch 2" or "not reached in 3 epochs"
# A sweep's parent: the runs of its grid's points that were FINISHED before it (DONE: skipped, not
# trained again), which its comparison counts with the runs it trained. Comma-separated run ids, in
# tags of at most MLflow's 8,000 characters: "pipeline.done_runs", then "pipeline.done_runs.2", ...
TAG_DONE_RUNS = "pipeline.done_runs"
# A published sweep counts a run (names the sweep's parent run id after the prefix): "setting" on the
# run that stands for its setting (its model run, one a setting: the view's rows), "repeat" on the
# others. A DONE run counted by several sweeps carries one such tag for each.
TAG_IN_SWEEP = "pipeline.in_sweep."
TAG_BEST_RUN = "pipeline.best_run"  # a sweep's parent: the run of its best setting (compare.pick), whose model it links
# A `repeats: auto` sweep's parent: why its rounds stopped, as printed at the sweep's end, e.g.
# "repeats: auto stopped after 4 rounds: every speedup is significant"
TAG_REPEATS_STOPPED = "pipeline.repeats_stopped"
TAG_CONTENDED = "pipeline.contended"  # set when other processes took a meaningful share: the figures
TAG_PEAK = "pipeline.peak"  # where PEAK_TFLOPS came from, or why a run has no MFU
TAG_BANDWIDTH = "pipeline.bandwidth"  # where PEAK_BANDWIDTH came from, or why a run has no BANDWIDTH_SHARE
TAG_CONCURRENT = "pipeline.concurrent_points"  # Ray: how many points shared the node while it trained

ARTIFACT_SUMMARY = "summary/model.txt"
ARTIFACT_BATCH = "inputs/train_batch.png"
ARTIFACT_TRACEBACK = "error/traceback.txt"
ARTIFACT_GRID_DIR = "grid"  # a parent's grid file, as written, under its own name
ARTIFACT_EFFECTIVE_GRID = "grid/effective.yaml"  # the grid it trained, after any --set

RESULTS_FILE = "pipeline-results.jsonl"
CHECKPOINT_DIR = ".pipeline-checkpoints"


# The longest experiment or registered model name every store takes: MLflow's tables hold a name in
# 256 characters (VARCHAR(256)), which PostgreSQL and MySQL enforce and sqlite does not; MLflow's own
# check allows 500 (mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH). Checked before anything is
# created, on every store, so that a grid that works on sqlite works on a server too.
MAX_NAME_LENGTH = 256


def length_problem(name: str) -> str | None:
    """Why a name is too long for some store, or None."""
    if len(name) > MAX_NAME_LENGTH:
        return (
            f"a name of {len(name)} characters; a tracking store's database holds at most {MAX_NAME_LENGTH} "
            "(PostgreSQL and MySQL refuse a longer one): choose a shorter name"
        )
    return None


def experiment_name_problem(name: str) -> str | None:
    """Why a store would refuse `name` as an experiment's name, or None."""
    return length_problem(name) or control_character_problem(name)


def control_character_problem(name: str) -> str | None:
    """Why a name holding a control character (NUL, a newline, ...) is refused, or None: PostgreSQL
    stores no NUL, and the others break the lines and filters that name it; refused on every store,
    so that a name that works on sqlite works on a server too."""
    import unicodedata

    found = next((c for c in name if unicodedata.category(c) == "Cc"), None)
    if found is not None:
        return f"the name holds a control character ({found!r} at {name.index(found)}), which stores refuse: remove it"
    # Bytes that are no UTF-8 (a shell's $'\xff'), which Python keeps as surrogates: no store can hold them.
    found = next((c for c in name if unicodedata.category(c) == "Cs"), None)
    if found is not None:
        return f"the name holds bytes that are not UTF-8 (at {name.index(found)}), which stores refuse: remove them"
    return None


# The fewest runs a side that the comparison judges (measures/stats.py: Welch's t on the logs of per-run
# values needs two per side for a spread); `repeats: auto` starts with this many rounds. Here, not in
# stats, so that the grid's checks read it without importing numpy and scipy.
MIN_RUNS = 2
