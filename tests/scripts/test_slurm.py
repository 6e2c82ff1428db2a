#!/usr/bin/env python3
"""The multi-node launchers, scripts/slurm/train.sbatch and scripts/mpirun_hosts.sh, without a
cluster: shell syntax (and shellcheck when installed); the dry run of 2 nodes x 4 GPUs under faked
SLURM_* variables (8 ranks, 4 per node, the config, --resume auto, the NCCL variables exported to
srun's ranks or forwarded with mpirun -x); bad input refused with one line and exit status 2; and,
with stand-ins for srun, scancel, scontrol and mpirun, the time-limit path: SIGUSR1 makes the ranks
checkpoint (SIGTERM) and the job requeue itself, while a run that ends on its own or fails is not
requeued.
"""
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import unittest

sys.dont_write_bytecode = True

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SBATCH = os.path.join(ROOT, "scripts", "slurm", "train.sbatch")
HOSTS = os.path.join(ROOT, "scripts", "mpirun_hosts.sh")
CONFIG = "configs/transformer_125m.json"

# Two nodes of 4 GPUs as sbatch --nodes=2 --ntasks-per-node=4 would describe them.
SLURM_2x4 = {"SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS_PER_NODE": "4", "SLURM_JOB_NODELIST": "gpu[01-02]",
             "SLURM_CPUS_ON_NODE": "64", "SLURM_SUBMIT_DIR": ROOT}
NCCL = {"NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_HCA": "mlx5_0,mlx5_1", "NCCL_DEBUG": "INFO"}

# srun and mpirun stand-ins: log their arguments, then run until scancel's stand-in has "signalled
# the ranks" (srun) or their child linac has ended (mpirun). SRUN_EXIT picks srun's own status:
# "wait" (wait for the stop), or a number to exit with at once.
SRUN = """#!/bin/bash
echo "$@" >"$FAKE_DIR/srun.args"
case "$SRUN_EXIT" in
  wait) for _ in $(seq 200); do [ -f "$FAKE_DIR/stopped" ] && exit 0; sleep 0.1; done; exit 1 ;;
  *) exit "$SRUN_EXIT" ;;
esac
"""
SCANCEL = """#!/bin/bash
echo "$@" >"$FAKE_DIR/scancel.args"
touch "$FAKE_DIR/stopped"
"""
SCONTROL = """#!/bin/bash
echo "$@" >>"$FAKE_DIR/scontrol.args"
"""
MPIRUN = """#!/bin/bash
echo "$@" >"$FAKE_DIR/mpirun.args"
for a; do case "$a" in */linac) bin="$a" ;; esac; done
"$bin" &
wait
"""
# Checkpoints and stops on SIGTERM like linac train (exit 0), else runs until killed.
LINAC = """#!/bin/bash
trap 'touch "$FAKE_DIR/stopped"; exit 0' TERM
touch "$FAKE_DIR/linac.started"
for _ in $(seq 200); do sleep 0.1; done
exit 1
"""


def launch_line(out):
    """The launch command of a dry run (its last line) as the shell reads it."""
    return shlex.split(out.strip().splitlines()[-1])


def exports(out):
    return dict(line[len("export "):].split("=", 1) for line in out.splitlines() if line.startswith("export "))


def clean_env():
    """The environment without SLURM_, NCCL_ and LINAC_ variables of the machine running the tests."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NCCL_", "LINAC"))}


class Syntax(unittest.TestCase):
    def test_bash_n(self):
        for script in (SBATCH, HOSTS):
            r = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, script + ": " + r.stderr)

    @unittest.skipUnless(shutil.which("shellcheck"), "shellcheck not installed")
    def test_shellcheck(self):
        r = subprocess.run(["shellcheck", SBATCH, HOSTS], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


class SbatchDryRun(unittest.TestCase):
    def dry(self, extra_env=None, args=(CONFIG, "--set", "train.out_dir=/shared/runs/a b")):
        env = dict(clean_env(), LINAC_DRY_RUN="1", **SLURM_2x4, **NCCL, **(extra_env or {}))
        r = subprocess.run(["bash", SBATCH, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def test_srun_2_nodes_x_4_gpus(self):
        out = self.dry()
        self.assertEqual(launch_line(out), [
            "srun", "--mpi=pmix", "--export=ALL", "--nodes=2", "--ntasks=8", "--ntasks-per-node=4",
            "--distribution=block", "--kill-on-bad-exit=1", "--cpus-per-task=16",
            os.path.join(ROOT, "build", "linac"), "train", CONFIG, "--resume", "auto",
            "--set", "train.out_dir=/shared/runs/a b"])
        # srun hands the exported environment to every rank: the NCCL variables are exported.
        self.assertEqual(exports(out), dict(NCCL, NCCL_NVLS_ENABLE="0"))
        self.assertIn("8 ranks", out.splitlines()[0])
        self.assertIn("gpu[01-02]", out.splitlines()[0])

    def test_mpirun_in_the_allocation_forwards_nccl_with_x(self):
        out = self.dry({"LINAC_LAUNCHER": "mpirun", "LINAC": "/opt/linac/bin/linac", "NCCL_NVLS_ENABLE": "1"})
        line = launch_line(out)
        self.assertEqual(line[:7], ["mpirun", "-np", "8", "--map-by", "ppr:4:node", "--bind-to", "none"])
        self.assertEqual(line[line.index("/opt/linac/bin/linac"):],
                         ["/opt/linac/bin/linac", "train", CONFIG, "--resume", "auto",
                          "--set", "train.out_dir=/shared/runs/a b"])
        forwarded = {line[i + 1] for i, w in enumerate(line) if w == "-x"}
        self.assertLessEqual(set(NCCL) | {"NCCL_NVLS_ENABLE"}, forwarded)
        self.assertEqual(exports(out)["NCCL_NVLS_ENABLE"], "1")  # the user's value wins

    def test_ranks_per_node_from_the_gpus_and_config_from_the_environment(self):
        env = dict(clean_env(), LINAC_DRY_RUN="1", SLURM_NNODES="3", SLURM_GPUS_ON_NODE="8", LINAC_CONFIG=CONFIG)
        r = subprocess.run(["bash", SBATCH], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        line = launch_line(r.stdout)
        self.assertIn("--ntasks=24", line)
        self.assertIn("--ntasks-per-node=8", line)
        self.assertEqual(line[-3:], [CONFIG, "--resume", "auto"])


class BadInput(unittest.TestCase):
    def assert_refused(self, script, args, env, needle):
        r = subprocess.run(["bash", script, *args], capture_output=True, text=True, cwd=ROOT,
                           env=dict(clean_env(), **env), timeout=60)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertEqual(r.stdout, "")
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertIn(needle, lines[0])
        self.assertIn("error: ", lines[0])

    def test_sbatch(self):
        dry = dict(SLURM_2x4, LINAC_DRY_RUN="1")
        self.assert_refused(SBATCH, [], dry, "no config")
        self.assert_refused(SBATCH, ["configs/missing.json"], dry, "not found")
        self.assert_refused(SBATCH, [CONFIG, "--resume", "auto"], dry, "always passes --resume auto")
        self.assert_refused(SBATCH, [CONFIG], {"LINAC_DRY_RUN": "1"}, "SLURM_JOB_NUM_NODES is not set")
        self.assert_refused(SBATCH, [CONFIG], dict(dry, SLURM_NTASKS_PER_NODE="four"), "positive integer")
        self.assert_refused(SBATCH, [CONFIG], dict(dry, LINAC_LAUNCHER="ssh"), "srun or mpirun")
        self.assert_refused(SBATCH, [CONFIG], dict(dry, LINAC_DRY_RUN="yes"), "0 or 1")
        self.assert_refused(SBATCH, [CONFIG], SLURM_2x4, "not inside a Slurm job")
        self.assert_refused(SBATCH, [CONFIG], dict(SLURM_2x4, SLURM_JOB_ID="7", LINAC="/nonexistent/linac"),
                            "not found or not executable")

    def test_hostfile(self):
        with tempfile.TemporaryDirectory() as d:
            no_slots = os.path.join(d, "no_slots")
            with open(no_slots, "w") as f:
                f.write("gpu01 slots=4\ngpu02\n")
            empty = os.path.join(d, "empty")
            with open(empty, "w") as f:
                f.write("# nothing\n\n")
            dry = {"LINAC_DRY_RUN": "1"}
            self.assert_refused(HOSTS, [], dry, "usage")
            self.assert_refused(HOSTS, [os.path.join(d, "missing"), CONFIG], dry, "hostfile")
            self.assert_refused(HOSTS, [no_slots, CONFIG], dry, "no_slots:2: give each host its GPU count as slots=N")
            self.assert_refused(HOSTS, [empty, CONFIG], dry, "names no host")
            self.assert_refused(HOSTS, [no_slots, "configs/missing.json"], dry, "not found")


class HostfileDryRun(unittest.TestCase):
    def test_2_hosts_x_4_gpus(self):
        with tempfile.TemporaryDirectory() as d:
            hostfile = os.path.join(d, "hosts")
            with open(hostfile, "w") as f:
                f.write("# the two GPU hosts\ngpu01 slots=4\n\ngpu02 slots=4  # second\n")
            env = dict(clean_env(), LINAC_DRY_RUN="1", LD_LIBRARY_PATH="/opt/nccl/lib", **NCCL)
            r = subprocess.run(["bash", HOSTS, hostfile, CONFIG, "--set", "train.lr=1e-3"], capture_output=True,
                               text=True, cwd=ROOT, env=env, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            line = launch_line(r.stdout)
            self.assertEqual(line[:9], ["mpirun", "-np", "8", "--hostfile", hostfile, "--map-by", "slot",
                                        "--bind-to", "none"])
            forwarded = [line[i + 1] for i, w in enumerate(line) if w == "-x"]
            self.assertEqual(set(forwarded), set(NCCL) | {"NCCL_NVLS_ENABLE", "LD_LIBRARY_PATH"})
            self.assertEqual(line[-7:], [os.path.join(ROOT, "build", "linac"), "train", CONFIG, "--resume", "auto",
                                         "--set", "train.lr=1e-3"])
            self.assertEqual(exports(r.stdout), dict(NCCL, NCCL_NVLS_ENABLE="0"))
            self.assertIn("gpu01 gpu02", r.stdout.splitlines()[0])


class TimeLimit(unittest.TestCase):
    """The real launch path with stand-ins on PATH (no dry run)."""

    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir)
        bin_dir = os.path.join(self.dir, "bin")
        os.mkdir(bin_dir)
        for name, text in (("srun", SRUN), ("scancel", SCANCEL), ("scontrol", SCONTROL), ("mpirun", MPIRUN),
                           ("linac", LINAC)):
            path = os.path.join(bin_dir, name)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
        self.env = dict(clean_env(), **SLURM_2x4, SLURM_JOB_ID="4242", FAKE_DIR=self.dir,
                        LINAC=os.path.join(bin_dir, "linac"), PATH=bin_dir + os.pathsep + os.environ["PATH"])

    def file(self, name):
        path = os.path.join(self.dir, name)
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return f.read().strip()

    def start(self, **env):
        return subprocess.Popen(["bash", SBATCH, CONFIG], cwd=ROOT, env=dict(self.env, **env), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def wait_for(self, name):
        for _ in range(300):
            if os.path.exists(os.path.join(self.dir, name)):
                return
            time.sleep(0.05)
        self.fail(name + " never appeared")

    def test_srun_usr1_stops_the_ranks_and_requeues(self):
        p = self.start(SRUN_EXIT="wait")
        self.wait_for("srun.args")
        p.send_signal(signal.SIGUSR1)
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, err)
        self.assertIn(f"train {CONFIG} --resume auto", self.file("srun.args"))
        self.assertEqual(self.file("scancel.args"), "--signal=TERM 4242")
        self.assertEqual(self.file("scontrol.args"), "requeue 4242")

    def test_mpirun_usr1_terms_the_local_rank_and_requeues(self):
        p = self.start(LINAC_LAUNCHER="mpirun")
        self.wait_for("linac.started")
        p.send_signal(signal.SIGUSR1)
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, err)
        self.assertTrue(os.path.exists(os.path.join(self.dir, "stopped")))  # linac itself got SIGTERM
        self.assertIsNone(self.file("scancel.args"))  # the daemons were left alone
        self.assertEqual(self.file("scontrol.args"), "requeue 4242")

    def test_a_run_that_ends_on_its_own_is_not_requeued(self):
        p = self.start(SRUN_EXIT="0")
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, err)
        self.assertIsNone(self.file("scontrol.args"))

    def test_a_failed_run_keeps_its_status_and_is_not_requeued(self):
        p = self.start(SRUN_EXIT="3")
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 3, err)
        self.assertIsNone(self.file("scontrol.args"))


if __name__ == "__main__":
    unittest.main()
