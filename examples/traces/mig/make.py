"""Writes this folder's synthetic MIG trace (openb's CSV format plus gpuslice's MIG columns), seeded, so
the files are reproducible: python3 examples/traces/mig/make.py (from the repository root)."""

import random
from pathlib import Path

HERE = Path(__file__).parent
PROFILES = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]  # on A100-80GB and H100-80GB


def main() -> None:
    rng = random.Random(2026)
    nodes = ["sn,cpu_milli,memory_mib,gpu,model,mig_gpus"]
    nodes += [f"a100-{i:02d},128000,1048576,8,A100-80GB,4" for i in range(8)]  # half their GPUs in MIG mode
    nodes += [f"h100-{i:02d},192000,2097152,8,H100,8" for i in range(4)]  # all in MIG mode
    nodes += [f"v100-{i:02d},96000,393216,8,V100M32," for i in range(12)]  # no MIG
    (HERE / "openb_node_list_gpu_node.csv").write_text("\n".join(nodes) + "\n")
    rows = [
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
        "creation_time,deletion_time,scheduled_time,mig_profile"
    ]
    t = 0
    for i in range(600):
        t += int(rng.expovariate(1 / 120))  # a pod every two minutes on average
        duration = int(rng.lognormvariate(7.5, 1.2)) + 30  # median ~30 minutes, a long tail
        qos = rng.choices(["LS", "Burstable", "BE"], [3, 5, 2])[0]
        kind, mig, spec = rng.random(), "", ""
        if kind < 0.35:  # a MIG instance
            num_gpu, milli = 1, 0
            mig = rng.choices(PROFILES, [8, 3, 4, 3, 1, 1])[0]
        elif kind < 0.75:  # a share
            num_gpu, milli = 1, rng.choice([100, 200, 250, 500, 700])
        else:  # whole GPUs, some pinned to V100
            num_gpu, milli = rng.choices([1, 2, 4, 8], [5, 3, 2, 1])[0], 1000
            spec = "V100M32" if rng.random() < 0.3 else ""
        cpu = rng.choice([2000, 4000, 8000, 16000]) * max(1, num_gpu // 2)
        memory = rng.choice([8192, 16384, 32768, 65536]) * max(1, num_gpu // 2)
        rows.append(f"mig-pod-{i:04d},{cpu},{memory},{num_gpu},{milli},{spec},{qos},Running,"
                    f"{t},{t + duration},{t},{mig}")  # fmt: skip
    (HERE / "openb_pod_list_mig.csv").write_text("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
