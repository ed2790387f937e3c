"""Stable identifiers the stages, the record, the doctor and tests match on (docs/design.md §4): problem
codes, outcome values, action kinds, exit statuses. Plain strings in a module of their own: every vLLM
process issues and logs its record without importing the value types (outcomes.py)."""

# How the loader finds a library (loader.LibraryResolution.how): the search step that gave the file.
FOUND_MAPPED = "mapped"  # already mapped in this process: a later dlopen gets that file
FOUND_LIBRARY_PATH = "LD_LIBRARY_PATH"
FOUND_LD_SO_CACHE = "ld.so.cache"
FOUND_DEFAULT_DIRS = "default directories"
FOUND_NOTHING = "not found"
# The search steps TMAGUARD_ROOT redirects (stages/trust.py).
FOUND_ON_THE_SYSTEM = (FOUND_LD_SO_CACHE, FOUND_DEFAULT_DIRS)

# Problem codes.
DRIVER_MISSING = "driver-missing"  # no libcuda.so.1 at all
DRIVER_UNREADABLE = "driver-unreadable"
SYMBOL_UNSUPPLIED = "symbol-unsupplied"  # vLLM needs it, the layer lacks it, nothing here supplies it
HANDLE_SCOPED_GAP = "handle-scoped-gap"  # looked up in libcuda.so.1's handle, which shims cannot answer
LOOKUP_SWAPPED = "lookup-swapped"  # a vCUDA build's cuGetProcAddress_v2 answers, handing out legacy ABIs
LAYER_DAEMON_MISSING = "layer-daemon-missing"  # a layer's daemon is unreachable: its first CUDA call dies
LAYER_CANNOT_LOAD = "layer-cannot-load"  # a preloaded layer this glibc cannot load: every process dies
OVERLAY_FAILED = "overlay-failed"
SHIM_FAILED = "shim-failed"
ROOT_REFUSED = "root-refused"  # a libcuda.so.1 found only under TMAGUARD_ROOT: nothing is loaded for it
RECORD_DIR_REFUSED = "record-dir-refused"
RECORD_NOT_WRITTEN = "record-not-written"
EXTENSION_UNREADABLE = "extension-unreadable"
IMPORTED_EARLY = "imported-early"  # a TMA-only extension imported before the guard could keep it out
TOGGLE_INVALID = "toggle-invalid"
TOGGLE_UNKNOWN = "toggle-unknown"  # a TMAGUARD_* variable that is not a toggle (a typo of one)
ROUTING_OVERRIDE = "routing-override"  # a user setting the guard had to override
ROUTING_IMPOSSIBLE = "routing-impossible"  # the user insists on what cannot be had (stops start-up)
MEMORY_FRACTION_TOO_HIGH = "memory-fraction-too-high"  # vLLM's share leaves too little of the layer's limit
MEMORY_UNENFORCED = "memory-unenforced"  # GPU shared with no memory limit: vLLM's default takes it whole
COMPAT_BYPASSES_LAYER = "compat-bypasses-layer"  # VLLM_ENABLE_CUDA_COMPATIBILITY under a replacing layer
LAYER_BYPASSED = "layer-bypassed"  # the pod's layer is configured, this process's libcuda.so.1 is not it
DRIVER_TOO_OLD = "driver-too-old"  # the NVIDIA driver predates the CUDA runtime torch and vLLM were built for
# A layer configured (preloaded, or its limits set) that the loader does not load: CUDA works, unmetered.
LAYER_NOT_IN_FORCE = "layer-not-in-force"
LAYER_WRITABLE = "layer-writable"  # the libcuda.so.1 the loader picks others can change (loaded anyway)

# Problems after which no CUDA call succeeds in the pod (the doctor never calls TMA usable beside one).
CUDA_BROKEN = frozenset({LOOKUP_SWAPPED, LAYER_DAEMON_MISSING, LAYER_CANNOT_LOAD, DRIVER_TOO_OLD})
# Problems the log line says at ERROR: vLLM cannot start here, whatever the guard supplies.
LOGGED_AS_ERROR = frozenset({DRIVER_TOO_OLD, LAYER_BYPASSED, LAYER_NOT_IN_FORCE})

# Outcome values: what an operator filters on (and fleet metrics count).
NO_GPU = "no-gpu"  # no GPU and no libcuda.so.1: nothing to do
COMPLETE = "nothing-missing"  # libcuda.so.1 has everything vLLM and its libraries need
SUPPLIED = "supplied"  # what it lacks was supplied
WOULD_SUPPLY = "would-supply"  # validate mode: what auto would supply
DEGRADED = "degraded"  # something stays broken (see problems)
NO_VLLM = "no-vllm"

# Action kinds.
LOAD_OVERLAY = "load-overlay"
LOAD_SHIM = "load-shim"
SET_ENV = "set-env"
BLOCK_IMPORT = "block-import"
SET_ARG = "set-arg"  # a vLLM flag added to the server's command line before vLLM parses it

# Exit statuses of every `tmaguard` command (docs/doctor.md, "Exit status"; the preflight acts on each).
EXIT_OK = 0  # healthy; done; nothing needed
EXIT_FINDINGS = 1  # the doctor found problems; `check` would warn; `record` has no valid record; refused
EXIT_USAGE = 2  # a usage error (argparse's and click's own status)
EXIT_INTERNAL = 3  # the command itself failed: a bug of ours, never a diagnosis
