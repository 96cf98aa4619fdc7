"""A property-based fuzzer of the command line: hostile values drawn for one option (or positional
argument) of a command at a time, the others left at their defaults, run through ``cli_fuzz.check``:
refused with exit 2 and one ``error:`` line before any work and with nothing written, or accepted up to
where the work starts, within the time bound.

The values come from a grammar of what an attacker or a tired user types (huge, negative, zero, NaN and
infinities, non-ASCII digits, empty, blank, very long, URLs that do not parse, a folder, a FIFO, a
device, a link, binary or empty files, a missing folder's child). CI runs ``GPUSLICE_FUZZ_EXAMPLES``
examples for each of the first seven commands (default 25) and a third of that for the others (``FULL``);
``benchmarks/fuzz_inputs.py`` runs many more and records what it found. Every number option is also
checked to refuse NaN, infinity and 30 digits. What a command reads from
its input files is fuzzed in ``test_fuzz_file_contents.py``.
"""

from __future__ import annotations

import pytest
from cli_fuzz import NUMBERS, PATHS, TEXT, Command, check, command_line, fuzz_settings
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuslice.cli.mig import REJECTED_EXIT

# Where the client commands' work starts: the HTTP request, after the URL, token and body are built.
HTTP = ("httpx.Client.send",)
# ... and where the node and cluster components' work starts: a connection to the API server, a socket.
K8S_API = ("gpuslice.k8s.kube_client.api_client", "gpuslice.k8s.dra.kube.DraApi")
SERVER = {"--url": TEXT, "--state-dir": PATHS}
KUBE = {"--kubeconfig": PATHS}
SECONDS = NUMBERS.map(lambda n: n + "s")

COMMANDS: dict[str, Command] = {
    "sim openb": Command(
        ["sim", "openb"],
        {"--seeds": NUMBERS, "--jobs": NUMBERS, "--tune": NUMBERS, "--policy": TEXT, "--trace": TEXT,
         "--trace-dir": PATHS, "--out": PATHS},
        # the runs' specs, made in this process once every check passed (a run itself may be in a pool
        # worker, where Reached would end the worker and leave the pool waiting)
        work=("gpuslice.sim.sweep.RunSpec",),
    ),
    "sim replay": Command(
        ["sim", "replay"],
        {"--load": NUMBERS, "--repeat": NUMBERS, "--node-stride": NUMBERS, "--seed": NUMBERS,
         "--queue": TEXT, "--policy": TEXT, "--trace": TEXT, "--trace-dir": PATHS, "--out": PATHS,
         "--topology": TEXT},
        # the declared run times of every pod (a stream of many copies: seconds) come before the replays
        work=("gpuslice.cli.replay.replay_timed", "gpuslice.cli.replay.estimates_for"),
    ),
    "tune": Command(
        ["tune"],
        {"--objective": TEXT, "--train": TEXT, "--holdout": TEXT, "--sample": NUMBERS,
         "--node-stride": NUMBERS, "--load": NUMBERS, "--trials": NUMBERS, "--jobs": NUMBERS,
         "--seed": NUMBERS, "--study": PATHS, "--out": PATHS},
        work=("gpuslice.cli.tune.run_study",),
    ),
    "predict": Command(
        ["predict"],
        {"--trace": TEXT, "--trace-dir": PATHS, "--train-fraction": NUMBERS, "--seed": NUMBERS,
         "--out": PATHS},
        work=("gpuslice.sim.duration_model.held_out_errors",),
    ),
    # quick commands run whole: exit 0 is their answer (`mig plan`: also some requests were rejected)
    "topo assign": Command(
        ["topo", "assign", "--machine", "dgx1", "--jobs", "2,2"],
        {"--machine": st.one_of(TEXT, PATHS), "--jobs": st.one_of(NUMBERS, TEXT),
         "--busy": st.one_of(NUMBERS, TEXT)},
    ),
    "mig plan": Command(
        ["mig", "plan", "--gpu", "a100-80gb", "--request", "3g.40gb"],
        {"--gpu": TEXT, "--request": st.one_of(NUMBERS, TEXT, NUMBERS.map(lambda n: n + "GiB")),
         "--policy": TEXT, "--from-layout": TEXT, "--gpu-index": NUMBERS},
        answers=frozenset({0, REJECTED_EXIT}),
    ),
    "topo show": Command(
        ["topo", "show", "--simulate", "dgx1-v100"], {"--simulate": TEXT, "--from-file": PATHS}
    ),
    "topo pick": Command(
        ["topo", "pick", "--simulate", "dgx-a100", "--gpus", "2"],
        {"--simulate": TEXT, "--gpus": NUMBERS, "--busy": st.one_of(NUMBERS, TEXT), "--policy": TEXT,
         "--need": TEXT},
    ),
    "mig profiles": Command(["mig", "profiles", "--gpu", "A100-80GB"], {"--gpu": TEXT}),
    "estimate": Command(
        ["estimate", "llama-3-8b"],
        {"--params": NUMBERS, "--dtype": TEXT, "--tp": NUMBERS, "--context": NUMBERS, "--batch": NUMBERS,
         "--kv-dtype": TEXT, "--gpus": NUMBERS, "--zero": NUMBERS, "--recompute": TEXT,
         "--micro-batch": NUMBERS, "--seq-len": NUMBERS},
    ),
    "memsim": Command(
        ["memsim", "--scale", "0.05"],
        {"--workload": TEXT, "--oversub": NUMBERS, "--evict": st.one_of(TEXT, PATHS),
         "--prefetch": st.one_of(TEXT, PATHS), "--tenants": TEXT, "--trace": PATHS, "--compare": TEXT,
         "--visibility": TEXT, "--scale": NUMBERS, "--cost-profile": PATHS, "--out": PATHS},
        work=("gpuslice.cli.memsim._simulate",),
    ),
    "serve": Command(
        ["serve"],
        {"--host": TEXT, "--port": NUMBERS, "--state-dir": PATHS, "--simulate": TEXT, "--sharing": TEXT,
         "--grace": st.one_of(TEXT, SECONDS), "--busy-timeout": TEXT,
         "--queue-policy": st.one_of(TEXT, PATHS), "--placement": st.one_of(TEXT, PATHS),
         "--policy-memory": st.one_of(TEXT, NUMBERS.map(lambda n: n + "MiB")),
         "--target-workload": PATHS, "--containment": TEXT, "--pids-max": NUMBERS, "--allow-host": TEXT},
        work=("gpuslice.server.run.listen",),
        env={"GPUSLICE_CONTAINMENT": "subreaper"},
    ),
    "submit": Command(
        ["submit"],
        {"--gpus": NUMBERS, "--mem": st.one_of(TEXT, NUMBERS.map(lambda n: n + "GiB")), "--cores": NUMBERS,
         "--mig": TEXT, "--gpu-model": TEXT, "--exclude-model": TEXT, "--topology": TEXT,
         "--priority": TEXT, "--tenant": TEXT, "--max-runtime": st.one_of(TEXT, SECONDS),
         "--restart": TEXT, "--host-memory": st.one_of(TEXT, NUMBERS.map(lambda n: n + "GiB")),
         "--cpus": NUMBERS, "--estimate": TEXT, "--params": NUMBERS, "--margin": NUMBERS, "--tp": NUMBERS,
         **SERVER},
        work=HTTP,
        tail=["--", "true"],
    ),
    "ps": Command(["ps"], {"--limit": NUMBERS, **SERVER}, work=HTTP),
    "show": Command(["show", "JOB"], {"JOB": TEXT, **SERVER}, work=HTTP),
    "cancel": Command(["cancel", "JOB"], {"JOB": TEXT, **SERVER}, work=HTTP),
    "logs": Command(["logs", "JOB"], {"JOB": TEXT, "--stream": TEXT, **SERVER}, work=HTTP),
    "gpus": Command(
        ["gpus"],
        {"--mark-unhealthy": NUMBERS, "--mark-healthy": NUMBERS, "--reason": TEXT, **SERVER},
        work=HTTP,
    ),
    "queue": Command(["queue"], SERVER, work=HTTP),
    "top": Command(["top", "--once"], {"--interval": NUMBERS, **SERVER}, work=HTTP),
    "tenants set": Command(
        ["tenants", "set", "NAME"],
        {"NAME": TEXT, "--weight": NUMBERS, "--max-gpus": st.one_of(NUMBERS, TEXT),
         "--max-gpu-memory": st.one_of(TEXT, NUMBERS.map(lambda n: n + "GiB")), **SERVER},
        work=HTTP,
    ),
    "tenants list": Command(["tenants", "list"], SERVER, work=HTTP),
    "policy list": Command(["policy", "list"], SERVER, work=HTTP),
    "policy map get": Command(
        ["policy", "map", "get", "NAME", "KEY"],
        {"NAME": TEXT, "KEY": st.one_of(NUMBERS, TEXT), "--family": TEXT, **SERVER},
        work=HTTP,
    ),
    "policy map delete": Command(
        ["policy", "map", "delete", "NAME", "KEY"],
        {"NAME": TEXT, "KEY": st.one_of(NUMBERS, TEXT), "--family": TEXT, "--wait": NUMBERS, **SERVER},
        work=HTTP,
    ),
    "tenants show": Command(["tenants", "show", "NAME"], {"NAME": TEXT, **SERVER}, work=HTTP),
    "policy load": Command(
        ["policy", "load", "FILE"], {"FILE": PATHS, "--wait": NUMBERS, **SERVER}, work=HTTP
    ),
    "policy unload": Command(
        ["policy", "unload", "FAMILY"], {"FAMILY": TEXT, "--wait": NUMBERS, **SERVER}, work=HTTP
    ),
    "policy events": Command(["policy", "events"], {"--limit": NUMBERS, **SERVER}, work=HTTP),
    "policy map update": Command(
        ["policy", "map", "update", "NAME", "KEY", "VALUE"],
        {"NAME": TEXT, "KEY": st.one_of(NUMBERS, TEXT), "VALUE": st.one_of(NUMBERS, TEXT), "--family": TEXT,
         "--wait": NUMBERS, **SERVER},
        work=HTTP,
    ),
    "policy export": Command(
        ["policy", "export", "NAME", "--out", "exported.py"], {"NAME": TEXT, "--family": TEXT, "--out": PATHS}
    ),
    "k8s extender": Command(
        ["k8s", "extender"],
        {"--host": TEXT, "--port": NUMBERS, "--metrics-port": NUMBERS, "--policy": st.one_of(TEXT, PATHS),
         "--target-workload": PATHS, "--node-lock-timeout": NUMBERS, **KUBE},
        work=("gpuslice.k8s.extender.KubernetesApi",),
    ),
    "k8s webhook": Command(
        ["k8s", "webhook", "--cert", "cert.pem", "--key", "key.pem"],
        {"--cert": PATHS, "--key": PATHS, "--port": NUMBERS, "--host": TEXT, "--scheduler-name": TEXT,
         "--dra-claims": TEXT, **KUBE},
        work=(*K8S_API, "gpuslice.k8s.webhook.run"),
    ),
    "k8s probe": Command(
        ["k8s", "probe", "URL"], {"URL": TEXT, "--timeout": NUMBERS}, work=("urllib.request.urlopen",)
    ),
    "k8s remove-daemonsets": Command(
        ["k8s", "remove-daemonsets", "--namespace", "gpuslice", "--daemonset", "gpuslice-device-plugin"],
        {"--namespace": TEXT, "--daemonset": TEXT, "--timeout": NUMBERS, **KUBE},
        work=K8S_API,
    ),
    "k8s device-plugin": Command(
        ["k8s", "device-plugin", "--simulate", "dgx-a100"],
        {"--simulate": TEXT, "--split-count": NUMBERS, "--socket-dir": PATHS, "--node-name": TEXT,
         "--sharing": TEXT, "--state-dir": PATHS, "--mig-layout": TEXT, "--metrics-port": NUMBERS,
         "--instance": TEXT, "--daemonset": TEXT, **KUBE},
        work=("gpuslice.k8s.device_plugin.serve",),
        env={"NODE_NAME": "node-a"},
    ),
    "k8s dra-driver": Command(
        ["k8s", "dra-driver", "--simulate", "dgx-a100"],
        {"--simulate": TEXT, "--node-name": TEXT, "--plugins-dir": PATHS, "--registry-dir": PATHS,
         "--cdi-dir": PATHS, "--sharing": TEXT, "--state-dir": PATHS, "--instance": TEXT,
         "--daemonset": TEXT, "--metrics-port": NUMBERS, **KUBE},
        work=K8S_API,
        env={"NODE_NAME": "node-a"},
    ),
    "k8s dra-allocator": Command(
        ["k8s", "dra-allocator"],
        {"--policy": TEXT, "--interval": NUMBERS, "--target-workload": PATHS, "--metrics-port": NUMBERS,
         **KUBE},
        work=K8S_API,
    ),
}  # fmt: skip
# The first seven commands fuzzed get every example; the rest (added later, many sharing their options:
# the server client's, a kubeconfig) a third, to keep CI's whole fuzz under its time.
FULL = {"sim openb", "sim replay", "tune", "predict", "topo assign", "mig plan", "estimate"}


def _fuzz(name: str):
    command = COMMANDS[name]
    options = command.options
    pairs = st.sampled_from(sorted(options)).flatmap(lambda o: st.tuples(st.just(o), options[o]))
    chosen = fuzz_settings()
    if name not in FULL:
        chosen = settings(chosen, max_examples=max(1, chosen.max_examples // 3))

    @chosen
    @given(pair=pairs)
    def run(tmp_path_factory: pytest.TempPathFactory, pair: tuple[str, str]) -> None:
        option, value = pair
        check(command, command_line(command, option, value), tmp_path_factory.mktemp("fuzz"))

    return run


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_drawn_input_is_refused_cleanly_before_any_work_or_accepted(command, tmp_path_factory) -> None:
    _fuzz(command)(tmp_path_factory)


# Values no count, ratio, port or duration of any command takes: each number option refuses them.
# nan passes every comparison (click's min and max too), 1e400 reads as infinity (past a min-only check),
# and 30 digits pass where a whole number has no upper bound.
OUT_OF_EVERY_RANGE = ("nan", "1e400", "9" * 30)


@pytest.mark.parametrize(
    ("command", "option"),
    [(name, option) for name, c in sorted(COMMANDS.items())
     for option, drawn in sorted(c.options.items()) if drawn is NUMBERS],
)  # fmt: skip
def test_every_number_option_refuses_non_finite_and_huge_values(command, option, tmp_path_factory) -> None:
    for value in OUT_OF_EVERY_RANGE:
        fuzzed = COMMANDS[command]
        check(fuzzed, command_line(fuzzed, option, value), tmp_path_factory.mktemp("n"), refused=True)
