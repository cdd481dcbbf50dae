"""The one way trained models are written and read: plain data only, so loading a run executes nothing.

SB3's own format unpickles (its zip's `data` entry carries cloudpickled objects, VecNormalize is saved
with pickle): a run directory handed to `pdgym-eval`, the leaderboard or a resume could run any code.
A pdgym model file is a zip archive of data:

    pdgym_model.json  format tag, the network spec (algorithm, policy class *by name* from a fixed table,
                      extractor arguments, net_arch, spaces), step counters, normalisation settings
    policy.pt         the policy's state_dict        (torch.save; read with torch.load(weights_only=True))
    optimizer.pt      checkpoints: the optimizer's state_dict (same)
    normalize.npz     trained with VecNormalize: running mean / var / count arrays (np.load, no pickle)
    replay.npz        checkpoints of off-policy algorithms: the replay buffer arrays (same)

Reading rebuilds the policy from the spec and loads only weights. Writing goes to a temporary name and
is renamed into place, so a reader sees a whole archive or none; a truncated file, an SB3 zip or a
pickle is refused with one line (`ModelFileError`), and `latest_complete` skips a damaged newest
checkpoint for the newest whole one.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import math
import os
import pickle  # only for the exception torch raises when weights_only refuses an object: nothing is unpickled
import re
import sys
import warnings
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pdgym.envs.sim import safe_files
from pdgym.envs.sim.config import ConfigError
from pdgym.envs.sim.shell import python_command

# What reading a damaged or foreign archive can raise (all become one ModelFileError line).
READ_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, KeyError, ValueError, TypeError,
               RuntimeError, pickle.UnpicklingError)
FIT_ERRORS = (RuntimeError, KeyError, ValueError, TypeError)  # weights that do not fit the network
FORMAT = "pdgym-model/1"
MAX_OBS_SIZE = 10**6  # numbers in an observation (the largest pdgym env's: a few thousand)
MAX_ACTIONS = 10**5  # actions of a Discrete space (pdgym's: slots + a few)
MAX_WIDTH = 1 << 16  # units of one hidden layer
MANIFEST = "pdgym_model.json"
COUNTERS = ("_episode_num", "_n_updates", "_n_calls")  # SB3 state a resume continues (where present)
REPLAY_ARRAYS = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts")


# Size bounds checked before a byte is read (docs/architecture.md, "Files pdgym reads, and their bounds"): a whole
# archive, its JSON manifest, and any other member (weights, optimizer state, npz arrays).
MAX_MODEL_BYTES = 2 * safe_files.GiB
MAX_MANIFEST_BYTES = safe_files.MiB
MAX_MEMBER_BYTES = safe_files.GiB


class ModelFileError(ConfigError):
    """A model file that is not a whole pdgym model archive (one line: path and why)."""


# --------------------------------------------------------------------------- the network, by name
# The algorithms a model may name, and where their classes live (the fixed table nothing in a file extends).
ALGOS = {"ppo": ("stable_baselines3", "PPO"), "a2c": ("stable_baselines3", "A2C"),
         "dqn": ("stable_baselines3", "DQN"), "maskable_ppo": ("sb3_contrib", "MaskablePPO")}


def algo_class(name: str):
    if name not in ALGOS:
        raise ConfigError(f"agent.algo: unknown {name!r}; allowed: {', '.join(ALGOS)}")
    mod, cls = ALGOS[name]
    return getattr(importlib.import_module(mod), cls)


def check_net_arch(arch: Any, key: str = "agent.net_arch") -> None:
    """SB3's net_arch: null, a list of layer widths (integers >= 1), or a mapping of such lists (pi / vf / qf)."""
    def widths(v) -> bool:
        return isinstance(v, list) and all(isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in v)

    ok = arch is None or widths(arch) or (isinstance(arch, dict) and set(arch) <= {"pi", "vf", "qf"}
                                          and all(widths(v) for v in arch.values()))
    if not ok:
        raise ConfigError(f"{key}: got {arch!r}; give a list of layer widths (integers >= 1), e.g. [64, 64], a "
                          "mapping {pi: [...], vf: [...]} (qf for dqn), or null for SB3's default")


@dataclass
class NetSpec:
    """Everything needed to rebuild a trained policy's network without its training code objects."""

    algo: str  # maskable_ppo | ppo | a2c | dqn
    policy: str  # an SB3 policy alias of the algorithm (MlpPolicy) or "pointer"
    features: dict  # extractor config with every layout value resolved: {kind, n_slots, ...}
    net_arch: Any
    obs_shape: list[int]
    n_actions: int

    @classmethod
    def from_env(cls, algo: str, policy: str, features: dict, net_arch, env) -> NetSpec:
        """Resolve the extractor's layout (and pointer action count) from an env probe once, at training."""
        from .extractors import policy_kwargs

        kind = (features or {}).get("kind", "flat")
        pk = policy_kwargs(features, net_arch, env)
        resolved = {"kind": kind, **dict(pk.get("features_extractor_kwargs") or {})}
        return cls(algo, "pointer" if kind == "pointer" else policy, resolved,
                   list(net_arch) if isinstance(net_arch, (list, tuple)) else net_arch,
                   [int(d) for d in env.observation_space.shape], int(env.action_space.n))

    def checked(self, where) -> NetSpec:
        """This spec as read from a manifest, within what pdgym-train writes: a known algorithm, an observation of
        1 to 3 dimensions and at most MAX_OBS_SIZE numbers, 1 to MAX_ACTIONS actions, net_arch layer widths
        (agent.net_arch's form, each at most MAX_WIDTH): a manifest saying obs_shape [10**12] would make the network
        allocate 931 GiB before any weight is compared. Else one ModelFileError line naming the key."""
        def bad(key: str, got, allowed: str):
            raise ModelFileError(f"{where}: {MANIFEST} spec.{key} = {str(got)[:60]!r}; allowed: {allowed}")

        if self.algo not in ALGOS:
            bad("algo", self.algo, ", ".join(ALGOS))
        dims = self.obs_shape
        if (not isinstance(dims, list) or not 1 <= len(dims) <= 3
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims)
                or math.prod(dims) > MAX_OBS_SIZE):
            bad("obs_shape", dims, f"1 to 3 integers >= 1, {MAX_OBS_SIZE} numbers at most")
        n = self.n_actions
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_ACTIONS:
            bad("n_actions", n, f"an integer in [1, {MAX_ACTIONS}]")
        try:
            check_net_arch(self.net_arch, f"{where}: {MANIFEST} spec.net_arch")
        except ConfigError as exc:
            raise ModelFileError(str(exc)) from None
        widths = self.net_arch.values() if isinstance(self.net_arch, dict) else [self.net_arch or []]
        if any(w > MAX_WIDTH for ws in widths for w in ws):
            bad("net_arch", self.net_arch, f"layer widths of at most {MAX_WIDTH}")
        if not isinstance(self.features, dict):
            bad("features", self.features, "a mapping {kind, ...}")
        return self

    def policy_class(self) -> type:
        from .extractors import pointer_policy

        if self.policy == "pointer":
            return pointer_policy(self.algo)
        aliases = algo_class(self.algo).policy_aliases
        if self.policy not in aliases:
            raise ConfigError(f"agent.policy: got {self.policy!r}; allowed: {', '.join(aliases)} "
                              "(or features.kind=pointer)")
        return aliases[self.policy]

    def policy_kwargs(self) -> dict:
        from .extractors import policy_kwargs

        return policy_kwargs(self.features, self.net_arch, None)

    def build_policy(self):
        """A fresh policy network (evaluation mode) of this spec."""
        import gymnasium as gym

        obs = gym.spaces.Box(-np.inf, np.inf, tuple(self.obs_shape), np.float32)
        policy = self.policy_class()(obs, gym.spaces.Discrete(self.n_actions), lambda _: 0.0,
                                     **self.policy_kwargs())
        policy.set_training_mode(False)
        return policy


# --------------------------------------------------------------------------- observation normalisation
@dataclass
class ObsNormalizer:
    """VecNormalize's observation transform from its saved statistics (what evaluation needs of it)."""

    mean: np.ndarray
    var: np.ndarray
    clip_obs: float
    epsilon: float

    def normalize_obs(self, obs: np.ndarray) -> np.ndarray:
        return np.clip((obs - self.mean) / np.sqrt(self.var + self.epsilon), -self.clip_obs, self.clip_obs)


def _norm_state(vec_norm) -> tuple[dict, dict]:
    settings = {k: getattr(vec_norm, k) for k in ("norm_obs", "norm_reward", "clip_obs", "clip_reward", "gamma",
                                                  "epsilon")}
    arrays = {"ret_mean": np.asarray(vec_norm.ret_rms.mean), "ret_var": np.asarray(vec_norm.ret_rms.var),
              "ret_count": np.asarray(vec_norm.ret_rms.count)}
    if vec_norm.norm_obs:  # SB3 keeps observation statistics only when it normalises observations
        arrays.update(obs_mean=vec_norm.obs_rms.mean, obs_var=vec_norm.obs_rms.var,
                      obs_count=np.asarray(vec_norm.obs_rms.count))
    return {k: (bool(v) if isinstance(v, (bool, np.bool_)) else float(v)) for k, v in settings.items()}, arrays


# --------------------------------------------------------------------------- writing
def _torch_bytes(obj) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _npz_bytes(arrays: dict) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    return buf.getvalue()


def write_atomic(path: Path, members: dict[str, bytes]) -> Path:
    """A zip of `members` at `path`, written under a temporary name, synced and renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with safe_files.atomic_path(path) as tmp, open(tmp, "wb") as fh:
        with zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED) as zf:
            for name, data in members.items():
                zf.writestr(name, data)
        fh.flush()
        os.fsync(fh.fileno())
    return path


@dataclass
class Saver:
    """Writes a model of one run (its spec and, if any, its VecNormalize) to a path; `training=True`
    adds what a resume needs (optimizer, counters, replay buffer)."""

    spec: NetSpec
    vec_norm: Any = None

    def __call__(self, model, path: Path, training: bool = False) -> Path:
        members = {"policy.pt": _torch_bytes(model.policy.state_dict())}
        manifest: dict = {"format": FORMAT, "spec": asdict(self.spec), "num_timesteps": int(model.num_timesteps),
                          "normalize": None, "counters": {}}
        if self.vec_norm is not None:
            manifest["normalize"], arrays = _norm_state(self.vec_norm)
            members["normalize.npz"] = _npz_bytes(arrays)
        if training:
            members["optimizer.pt"] = _torch_bytes(model.policy.optimizer.state_dict())
            manifest["counters"] = {k: int(getattr(model, k)) for k in COUNTERS if hasattr(model, k)}
            rb = getattr(model, "replay_buffer", None)
            if rb is not None:
                arrays = {k: getattr(rb, k) for k in REPLAY_ARRAYS if getattr(rb, k, None) is not None}
                members["replay.npz"] = _npz_bytes(arrays)
                manifest["replay"] = {"pos": int(rb.pos), "full": bool(rb.full)}
        manifest["members"] = sorted(members)
        members[MANIFEST] = json.dumps(manifest, indent=1).encode()
        return write_atomic(path, members)


# --------------------------------------------------------------------------- reading
def read(path: Path, training: bool = False, sha256: str | None = None) -> dict:
    """The archive's manifest and data: {manifest, spec, policy, [optimizer, replay], normalize}.
    Only JSON, weights-only torch tensors and pickle-free npz arrays are read. `sha256`: the archive's
    recorded digest (a zoo entry); the bytes are read once, checked against it, and only those are opened."""
    import torch

    path = Path(path)
    try:
        safe_files.check_regular_file(path, MAX_MODEL_BYTES, "model file")
        source = path if sha256 is None else io.BytesIO(checked_bytes(path, sha256))
    except ConfigError as exc:
        raise ModelFileError(str(exc)) from None
    try:
        with zipfile.ZipFile(source) as zf:
            names = set(zf.namelist())
            if MANIFEST not in names:
                raise ModelFileError(f"{path}: not a pdgym model file (no {MANIFEST}); SB3 zips and pickles are "
                                     "never loaded because loading them can run code: retrain with pdgym-train")

            _check_sizes(zf, f"model file {path}")  # every member's declared size, before any is read
            manifest = safe_files.parse_json(zf.read(MANIFEST).decode("utf-8"), f"model file {path}", MANIFEST)
            if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
                raise ModelFileError(f"{path}: model format {manifest.get('format') if isinstance(manifest, dict) else None!r}"
                                     f"; this pdgym reads {FORMAT!r}")
            missing = [m for m in manifest.get("members", []) if m not in names]
            if missing:
                raise ModelFileError(f"{path}: incomplete model file (missing {', '.join(missing)})")

            def tensors(name):
                with warnings.catch_warnings():  # torch's pickle-protocol notes before the error it raises anyway
                    warnings.simplefilter("ignore")
                    return torch.load(io.BytesIO(zf.read(name)), map_location="cpu", weights_only=True)

            def arrays(name):
                with np.load(io.BytesIO(zf.read(name)), allow_pickle=False) as z:
                    return {k: z[k] for k in z.files}

            out = {"manifest": manifest, "spec": NetSpec(**manifest["spec"]).checked(path), "policy": tensors("policy.pt"),
                   "normalize": arrays("normalize.npz") if "normalize.npz" in names else None}
            if training:
                out["optimizer"] = tensors("optimizer.pt") if "optimizer.pt" in names else None
                out["replay"] = arrays("replay.npz") if "replay.npz" in names else None
            return out
    except (ModelFileError, FileNotFoundError):
        raise
    except ConfigError as exc:  # a member over its bound
        raise ModelFileError(str(exc)) from None
    except READ_ERRORS as exc:  # truncated zip, corrupt member, a pickle that weights_only refuses, bad spec
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelFileError(f"{path}: unreadable or truncated model file ({why[:200]})") from None


def checked_bytes(path: Path, sha256: str) -> bytes:
    """The file's bytes if their sha256 is `sha256`; a changed archive is refused with one line."""
    data = safe_files.read_bytes(path, MAX_MODEL_BYTES, "model file")
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise ModelFileError(f"{path}: sha256 {got[:16]}... differs from the {sha256[:16]}... recorded for it; the "
                             f"archive was changed or damaged (refresh the entry: {python_command()} -m pdgym.agents.zoo add)")
    return data


def _check_sizes(zf: zipfile.ZipFile, what: str) -> None:
    for info in zf.infolist():
        safe_files.check_zip_member(info, MAX_MANIFEST_BYTES if info.filename == MANIFEST else MAX_MEMBER_BYTES, what)


def is_complete(path: Path) -> bool:
    """A whole archive: central directory present, every listed member there, every CRC right."""
    try:
        safe_files.check_regular_file(path, MAX_MODEL_BYTES, "model file")
        with zipfile.ZipFile(path) as zf:
            _check_sizes(zf, "model file")  # testzip reads every member whole: sizes first
            if MANIFEST not in zf.namelist() or zf.testzip() is not None:
                return False
            manifest = safe_files.parse_json(zf.read(MANIFEST).decode("utf-8"), "model file", MANIFEST)
            return isinstance(manifest, dict) and manifest.get("format") == FORMAT and all(
                m in zf.namelist() for m in manifest.get("members", []))
    except READ_ERRORS:
        return False


def checkpoints(ckpt_dir: Path) -> list[Path]:
    """The periodic checkpoints model_<steps>.zip of a run, oldest first."""
    found = [(int(m.group(1)), p) for p in Path(ckpt_dir).glob("model_*.zip")
             if (m := re.fullmatch(r"model_(\d+)\.zip", p.name))]  # model_x1.zip is no checkpoint of ours
    return [p for _, p in sorted(found)]


def latest_complete(ckpt_dir: Path) -> Path | None:
    """The newest whole checkpoint; damaged newer ones are named on stderr and skipped (only when a whole one is
    found: with none, the caller's one error line is all that is printed)."""
    skipped = []
    for p in reversed(checkpoints(ckpt_dir)):
        if is_complete(p):
            for s in skipped:
                print(f"pdgym: skipping damaged checkpoint {s}", file=sys.stderr)
            return p
        skipped.append(p)
    return None


def load_policy(path: Path, sha256: str | None = None) -> tuple[Any, NetSpec, ObsNormalizer | None]:
    """(policy network with the saved weights, its spec, its observation normaliser or None)."""
    data = read(path, sha256=sha256)
    spec = data["spec"]
    try:
        policy = spec.build_policy()
        policy.load_state_dict(data["policy"])
    except FIT_ERRORS as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ModelFileError(f"{path}: weights do not fit the saved network spec ({str(exc).splitlines()[0][:200]})") \
            from None
    norm, settings = data["normalize"], data["manifest"].get("normalize")
    obs_norm = None
    if norm is not None and settings and settings.get("norm_obs"):
        obs_norm = ObsNormalizer(norm["obs_mean"], norm["obs_var"], float(settings["clip_obs"]),
                                 float(settings["epsilon"]))
    return policy, spec, obs_norm


def load_predictor(path: Path, sha256: str | None = None, trained_on: str | None = None):
    """predict(obs, mask) -> action of a saved model (see `predictor`), for an evaluating process.

    Sets PyTorch to one thread: one observation at a time through a small network gains nothing from
    intra-op threads, and several evaluating processes (the leaderboard's workers) each running the
    default thread count oversubscribe the cores: 1.7 ms per decision on one thread against 28 ms on
    two, with two such processes on a 2-core machine (measured 2026-11-25)."""
    import torch

    torch.set_num_threads(1)
    policy, spec, obs_norm = load_policy(path, sha256)
    return predictor(policy, spec.algo, obs_norm, trained_on)


def restore(model, path: Path, vec_norm=None) -> int:
    """Continue a run: load a checkpoint's weights, optimizer, counters, replay buffer and normalisation
    statistics into a freshly built `model` of the same spec; returns its step count."""
    data = read(path, training=True)
    try:
        model.policy.load_state_dict(data["policy"])
        if data["optimizer"] is not None:
            model.policy.optimizer.load_state_dict(data["optimizer"])
    except FIT_ERRORS as exc:
        raise ModelFileError(f"{path}: does not fit this run's network ({str(exc).splitlines()[0][:200]})") from None
    m = data["manifest"]
    model.num_timesteps = int(m["num_timesteps"])
    for k, v in (m.get("counters") or {}).items():
        if k in COUNTERS and hasattr(model, k):
            setattr(model, k, int(v))
    rb, replay = getattr(model, "replay_buffer", None), data["replay"]
    if rb is not None and replay is not None:
        for k, v in replay.items():
            if k in REPLAY_ARRAYS and getattr(rb, k, None) is not None and getattr(rb, k).shape == v.shape:
                setattr(rb, k, v.astype(getattr(rb, k).dtype, copy=False))
        rb.pos, rb.full = int(m["replay"]["pos"]), bool(m["replay"]["full"])
    norm = data["normalize"]
    if vec_norm is not None and norm is not None:
        if vec_norm.norm_obs and "obs_mean" in norm:
            vec_norm.obs_rms.mean, vec_norm.obs_rms.var = norm["obs_mean"], norm["obs_var"]
            vec_norm.obs_rms.count = float(norm["obs_count"])
        vec_norm.ret_rms.mean, vec_norm.ret_rms.var = norm["ret_mean"], norm["ret_var"]
        vec_norm.ret_rms.count = float(norm["ret_count"])
    return model.num_timesteps


# --------------------------------------------------------------------------- acting
def predictor(policy, algo: str, obs_norm=None, trained_on: str | None = None):
    """predict(obs, mask) -> action: the policy's greedy action among the allowed ones.

    MaskablePPO masks its logits as sb3-contrib does (-1e8 where masked); for PPO / A2C the categorical logits
    and for DQN the Q-values are masked here, so an agent trained without masks never picks an infeasible
    action at evaluation. `obs_norm` is anything with normalize_obs (a live VecNormalize while training, an
    ObsNormalizer after).

    An evaluation calls this once per decision, sequentially (a poorly trained router can take ~10^6 of them in
    one held-out run: 125 s of a 162 s evaluation went to SB3's predict path). With a Box observation, the
    actor-critic logits come from the actor's layers alone (features, policy MLP, action head), skipping
    obs_to_tensor's preprocessing and the distribution objects, and repeats only their float ops: the same
    actions (tests/test_agents.py) at about half the cost per call (66 against 120 us for MaskablePPO's
    default MLP on the 2-core machine; held-out evaluation 2.0x faster, docs/agents.md).
    """
    import torch
    from gymnasium import spaces
    from stable_baselines3.common.policies import BasePolicy

    box = isinstance(policy.observation_space, spaces.Box)
    size = int(np.prod(policy.observation_space.shape)) if box else None
    actor_critic = algo != "dqn" and box and hasattr(policy, "mlp_extractor") and hasattr(policy, "action_net")

    def tensor(obs: np.ndarray):
        return torch.as_tensor(obs).reshape(1, -1) if box else policy.obs_to_tensor(obs)[0]

    def predict(obs: np.ndarray, mask: np.ndarray) -> int:
        obs = np.asarray(obs, dtype=np.float32)
        if size is not None and obs.size != size:  # another cluster shape (instances, DP units, window) than the one it was trained on
            where = (f"scenario={trained_on}: add it to the command" if trained_on
                     else "its agent.json or zoo entry names that scenario")
            raise ConfigError(f"policy: the agent takes observations of {size} values and this scenario gives "
                              f"{obs.size}: its cluster differs from the one the agent was trained on ({where})")
        if obs_norm is not None:
            obs = obs_norm.normalize_obs(obs).astype(np.float32)
        mask = np.asarray(mask, dtype=bool)
        if policy.training:  # what SB3's predict() does on every call (a walk over all modules): once here
            policy.set_training_mode(False)
        with torch.no_grad():
            t = tensor(obs)
            if actor_critic:  # the float ops of SB3's distributions, so ties break as theirs do
                feats = BasePolicy.extract_features(policy, t, policy.pi_features_extractor)
                z = policy.action_net(policy.mlp_extractor.forward_actor(feats))
                if algo == "maskable_ppo":  # MaskableCategorical: masked logits -1e8, argmax of the probs
                    z = torch.where(torch.as_tensor(mask).reshape(1, -1), z, torch.tensor(-1e8, dtype=z.dtype))
                    z = z - z.logsumexp(dim=-1, keepdim=True)
                    return int(torch.softmax(z, dim=-1).argmax(dim=1)[0])
                score = (z - z.logsumexp(dim=-1, keepdim=True))[0].numpy()  # Categorical's normalised logits
            elif algo == "maskable_ppo":  # = policy.predict(obs, action_masks=mask, deterministic=True)
                return int(policy.get_distribution(t, action_masks=mask).get_actions(deterministic=True)[0])
            elif algo == "dqn":
                score = policy.q_net(t)[0].cpu().numpy()
            else:
                score = policy.get_distribution(t).distribution.logits[0].cpu().numpy()
        if not mask.any():
            return int(np.argmax(score))
        return int(np.argmax(np.where(mask, score, -np.inf)))

    return predict
