"""The webhook's DRA rewrite: a chosen pod's gpuslice.io resources become a claim from a
ResourceClaimTemplate of its shape, created once per namespace and shape; the pod gets the allocator's
gate; bad quantities and impossible asks are refused with the reason; the device-plugin path is
unchanged for pods not chosen; a dry run creates nothing; an API failure refuses the pod with why."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from test_webhook import pod, review

from gpuslice.k8s.dra.allocator import GATE
from gpuslice.k8s.dra.classes import CLASS_MIG, CLASS_SHARED, CLASS_WHOLE
from gpuslice.k8s.dra.rewrite import CLAIM_NAME, LABEL_DRA, DraClaims
from gpuslice.k8s.webhook import DraRewrite, admit


class Templates:
    """A TemplateStore over a dict (namespace, name) -> template; ``broken`` fails every create."""

    def __init__(self, broken: bool = False) -> None:
        self.stored: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls = 0
        self.broken = broken

    def ensure_template(self, namespace: str, template: dict[str, Any]) -> None:
        self.calls += 1
        if self.broken:
            raise RuntimeError("the API server answered 403 Forbidden")
        self.stored.setdefault((namespace, template["metadata"]["name"]), template)


def labelled(resources: dict[str, Any], **extra: Any) -> dict[str, Any]:
    body = pod(resources, **extra)
    body["metadata"]["labels"] = {LABEL_DRA: "true"}
    return body


def apply(body: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """A JSONPatch of add/remove operations applied as the API server applies it (RFC 6902)."""
    out = json.loads(json.dumps(body))
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = out
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if op["op"] == "remove":
            del target[last]
        elif last == "-":
            target.append(op["value"])
        else:
            target[last] = op["value"]
    return out


def rewritten(body: dict[str, Any], templates: Templates, mode: DraClaims = DraClaims.LABEL, **req: Any):
    request = review(body)
    request["request"].update(req)
    answer = admit(request, dra=DraRewrite(mode, templates))["response"]
    assert answer["allowed"], answer
    return apply(body, json.loads(base64.b64decode(answer["patch"]))) if "patch" in answer else body


def test_a_share_becomes_a_claim_from_a_template_of_its_shape() -> None:
    templates = Templates()
    limits = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "4096", "gpuslice.io/gpucores": "30"}
    out = rewritten(labelled({"limits": limits, "requests": {"cpu": "1"}}), templates)
    container = out["spec"]["containers"][0]
    assert container["resources"] == {
        "limits": {},
        "requests": {"cpu": "1"},
        "claims": [{"name": CLAIM_NAME}],
    }
    name = "gpuslice-share-4096mi-30c"
    assert out["spec"]["resourceClaims"] == [{"name": CLAIM_NAME, "resourceClaimTemplateName": name}]
    assert out["spec"]["schedulingGates"] == [{"name": GATE}]
    assert "schedulerName" not in out["spec"]  # kube-scheduler binds DRA pods
    template = templates.stored[("team-a", name)]
    assert template["kind"] == "ResourceClaimTemplate" and template["apiVersion"] == "resource.k8s.io/v1"
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"] == {
        "deviceClassName": CLASS_SHARED,
        "count": 1,
        "capacity": {"requests": {"cores": "30", "memory": "4096Mi"}},
    }


def test_whole_gpus_and_a_mig_profile_get_their_classes_and_pods_of_one_shape_share_a_template() -> None:
    templates = Templates()
    for _ in range(2):
        out = rewritten(labelled({"limits": {"gpuslice.io/gpu": "2"}}), templates)
        assert out["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == "gpuslice-whole-2"
    whole = templates.stored[("team-a", "gpuslice-whole-2")]["spec"]["spec"]["devices"]["requests"][0]
    assert whole["exactly"] == {"deviceClassName": CLASS_WHOLE, "count": 2}
    rewritten(labelled({"limits": {"gpuslice.io/mig-3g.40gb": "1"}}), templates)
    mig = templates.stored[("team-a", "gpuslice-mig-3g-40gb")]["spec"]["spec"]["devices"]["requests"][0]
    assert mig["exactly"]["deviceClassName"] == CLASS_MIG
    assert mig["exactly"]["selectors"] == [
        {"cel": {"expression": 'device.attributes["gpu.gpuslice.io"].migProfile == "3g.40gb"'}}
    ]
    assert len(templates.stored) == 2


def test_the_rewritten_claim_is_one_the_allocator_decides() -> None:
    from gpuslice.k8s.dra.claim_ask import claim_ask

    templates = Templates()
    rewritten(labelled({"limits": {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "2048"}}), templates)
    (template,) = templates.stored.values()
    ask = claim_ask({"spec": template["spec"]["spec"]})
    assert ask is not None and (ask.count, ask.memory_mib, ask.cores, ask.exclusive) == (1, 2048, 1, False)


def test_pods_not_chosen_keep_the_device_plugin_path() -> None:
    templates = Templates()
    out = rewritten(pod({"limits": {"gpuslice.io/gpu": "1"}}), templates)  # no label
    assert out["spec"]["schedulerName"] == "gpuslice-scheduler" and "resourceClaims" not in out["spec"]
    out = rewritten(labelled({"limits": {"gpuslice.io/gpu": "1"}}), templates, DraClaims.OFF)
    assert "resourceClaims" not in out["spec"]
    out = rewritten(pod({"limits": {"gpuslice.io/gpu": "1"}}), templates, DraClaims.ALL)  # every pod
    assert out["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == "gpuslice-whole-1"


def test_existing_claims_and_gates_are_kept() -> None:
    body = labelled(
        {"limits": {"gpuslice.io/gpu": "1"}, "claims": [{"name": "scratch"}]},
        resourceClaims=[{"name": "scratch", "resourceClaimName": "disk"}],
        schedulingGates=[{"name": "example.com/quota"}],
    )
    out = rewritten(body, Templates())
    assert [c["name"] for c in out["spec"]["resourceClaims"]] == ["scratch", CLAIM_NAME]
    assert out["spec"]["containers"][0]["resources"]["claims"] == [{"name": "scratch"}, {"name": CLAIM_NAME}]
    assert out["spec"]["schedulingGates"] == [{"name": "example.com/quota"}, {"name": GATE}]


def test_a_dry_run_creates_no_template() -> None:
    templates = Templates()
    out = rewritten(labelled({"limits": {"gpuslice.io/gpu": "1"}}), templates, dryRun=True)
    assert out["spec"]["resourceClaims"] and templates.calls == 0


@pytest.mark.parametrize(
    ("limits", "annotations", "reason"),
    [
        ({"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "-5"}, {}, "not a whole non-negative number"),
        ({"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "4.5Gi"}, {}, "'4.5Gi' asks for 4,831,838,208 MiB"),
        ({"gpuslice.io/gpu": "one"}, {}, "not a Kubernetes quantity"),
        ({"gpuslice.io/gpu": "1", "gpuslice.io/gpucores": "250"}, {}, "1..100"),
        ({"gpuslice.io/gpu": "2", "gpuslice.io/gpumem": "1024"}, {}, "a share of a GPU is for one GPU"),
        ({"gpuslice.io/mig-9g.99gb": "1"}, {}, "no GPU has MIG profile"),
        ({"gpuslice.io/gpu": "1"}, {"gpuslice.io/gpu-models": "H100"}, "not carried into DRA claims"),
    ],
)
def test_hostile_asks_are_refused_with_the_reason_and_create_nothing(
    limits: dict[str, str], annotations: dict[str, str], reason: str
) -> None:
    templates = Templates()
    body = labelled({"limits": limits}, annotations=annotations)
    answer = admit(review(body), dra=DraRewrite(DraClaims.LABEL, templates))["response"]
    assert answer["allowed"] is False and answer["status"]["code"] == 400
    assert reason in answer["status"]["message"], answer["status"]["message"]
    assert templates.calls == 0


def test_a_template_the_api_refuses_refuses_the_pod_with_why() -> None:
    body = labelled({"limits": {"gpuslice.io/gpu": "1"}})
    answer = admit(review(body), dra=DraRewrite(DraClaims.LABEL, Templates(broken=True)))["response"]
    assert answer["allowed"] is False and answer["status"]["code"] == 503
    assert "could not create ResourceClaimTemplate gpuslice-whole-1" in answer["status"]["message"]
    assert "403 Forbidden" in answer["status"]["message"]


def containers_pod(
    app: dict[str, dict[str, str]], init: dict[str, dict[str, str]] | None = None
) -> dict[str, Any]:
    """A labelled pod of app containers (and init containers), each name -> its limits."""
    body = labelled({})
    body["spec"]["containers"] = [
        {"name": n, "image": "x", "resources": {"limits": dict(lim)}} for n, lim in app.items()
    ]
    if init:
        body["spec"]["initContainers"] = [
            {"name": n, "image": "x", "resources": {"limits": dict(lim)}} for n, lim in init.items()
        ]
    return body


SHARE = {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "4096", "gpuslice.io/gpucores": "30"}


def test_each_asking_container_gets_its_own_claim_and_an_init_container_runs_on_the_first() -> None:
    templates = Templates()
    body = containers_pod(
        {"train": SHARE, "log": {"cpu": "1"}, "serve": {"gpuslice.io/gpu": "1"}},
        init={"fetch": {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "2048", "gpuslice.io/gpucores": "10"}},
    )
    out = rewritten(body, templates)
    claims = {
        c["name"]: c["resources"].get("claims")
        for c in (*out["spec"]["containers"], *out["spec"]["initContainers"])
    }
    assert claims == {
        "train": [{"name": CLAIM_NAME}],
        "log": None,  # asks for nothing: untouched
        "serve": [{"name": f"{CLAIM_NAME}-1"}],
        "fetch": [{"name": CLAIM_NAME}],  # runs inside the first slice: the first claim
    }
    assert out["spec"]["resourceClaims"] == [
        {"name": CLAIM_NAME, "resourceClaimTemplateName": "gpuslice-share-4096mi-30c"},
        {"name": f"{CLAIM_NAME}-1", "resourceClaimTemplateName": "gpuslice-whole-1"},
    ]
    for c in (*out["spec"]["containers"], *out["spec"]["initContainers"]):
        assert not any(k.startswith("gpuslice.io/") for k in c["resources"]["limits"]), c
    assert out["spec"]["schedulingGates"] == [{"name": GATE}]
    assert sorted(name for _, name in templates.stored) == ["gpuslice-share-4096mi-30c", "gpuslice-whole-1"]


def test_two_containers_of_one_shape_share_a_template_but_each_has_its_own_claim() -> None:
    templates = Templates()
    out = rewritten(containers_pod({"a": SHARE, "b": SHARE}), templates)
    assert [(c["name"], c["resourceClaimTemplateName"]) for c in out["spec"]["resourceClaims"]] == [
        (CLAIM_NAME, "gpuslice-share-4096mi-30c"),
        (f"{CLAIM_NAME}-1", "gpuslice-share-4096mi-30c"),
    ]
    assert [c["resources"]["claims"] for c in out["spec"]["containers"]] == [
        [{"name": CLAIM_NAME}],
        [{"name": f"{CLAIM_NAME}-1"}],
    ]
    assert templates.calls == 1  # one template, made once


def test_a_pod_whose_claims_are_named_like_ours_or_whose_init_container_asks_too_much_is_refused() -> None:
    templates = Templates()
    body = containers_pod({"a": SHARE, "b": SHARE})
    body["spec"]["resourceClaims"] = [{"name": f"{CLAIM_NAME}-1", "resourceClaimName": "mine"}]
    answer = admit(review(body), dra=DraRewrite(DraClaims.LABEL, templates))["response"]
    assert answer["allowed"] is False
    assert f"already has a resource claim named '{CLAIM_NAME}-1'" in answer["status"]["message"]
    big = containers_pod({"a": SHARE}, init={"i": {"gpuslice.io/gpu": "1", "gpuslice.io/gpumem": "8192"}})
    answer = admit(review(big), dra=DraRewrite(DraClaims.LABEL, Templates()))["response"]
    assert answer["allowed"] is False and "'i'" in answer["status"]["message"]


def test_the_claims_of_a_rewritten_pod_are_placed_together_by_the_allocator() -> None:
    """The webhook's output as kube-controller-manager would turn it into claims, then one allocator pass:
    both claims on one node, the pod ungated."""
    import copy

    from test_dra_allocator import FakeApi

    from gpuslice.k8s.dra.allocator import DraAllocator

    templates = Templates()
    out = rewritten(containers_pod({"a": SHARE, "b": {"gpuslice.io/gpu": "2"}}), templates)
    api = FakeApi()
    api.add_node("n1", "dgx-h100")
    api.add_node("n2", "dgx-h100")
    by_name = {name: t for (_, name), t in templates.stored.items()}
    statuses = []
    for k, entry in enumerate(out["spec"]["resourceClaims"]):
        made = f"pod-{k}"
        template = by_name[entry["resourceClaimTemplateName"]]
        api.claims[("t", made)] = {
            "metadata": {"namespace": "t", "name": made, "uid": f"u-{k}"},
            "spec": copy.deepcopy(template["spec"]["spec"]),
        }
        statuses.append({"name": entry["name"], "resourceClaimName": made})
    meta = {"namespace": "t", "name": "pod", "uid": "p", "creationTimestamp": "0"}
    api.pods.append({"metadata": meta, "spec": out["spec"], "status": {"resourceClaimStatuses": statuses}})
    assert DraAllocator(api).run_once() == 1 and not api.gated("pod")
    pools = {r["pool"] for k in range(2) for r in api.results(f"pod-{k}")}
    assert len(pools) == 1 and len(api.results("pod-1")) == 2
