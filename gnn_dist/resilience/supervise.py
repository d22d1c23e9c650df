"""`gnn-dist supervise [--max-restarts K] [--backoff S] [--hosts-file F --parts-for P:DIR,...] -- LAUNCH COMMAND...`:
restart a crashed job from its checkpoint, on the hosts still answering.

The launch command is anything that runs `gnn-dist train ... --checkpoint-dir DIR`
(`mpiexec -n 4 gnn-dist train ...`, a cluster's `srun` or `mpirun` line). When
it fails, the supervisor runs it again with `--resume` appended (when the
command does not hold it already), after S seconds, at most K times, and logs
the epoch each restart resumes from. It tells a crash from bad input by the
exit status that `gnn-dist train` documents:

    0  finished                    2  usage error (bad arguments)
    1  a rank failed or hung       3  set-up refused the input (missing files, a checkpoint
    other  the launcher's own         that does not fit, a diverged loss): one line says why
           (9: a rank was killed)

2 and 3 are never retried: running the same input again would fail the same
way. SIGINT and SIGTERM go to the job and stop the supervisor without a
restart. The restarted job learns its attempt number from GNN_DIST_RESTARTS
(its final metrics record reports `restarts`); its metrics file holds every
epoch once, because a resumed run rewrites the records its checkpoint kept.

With `--hosts-file F --parts-for P:DIR,...` it also shrinks: before every launch it probes the hosts
(`--probe`, by default a non-interactive ssh), takes the largest P with a partition that the answering hosts'
slots hold, and fills the launch command's `{n}`, `{parts}`, `{hosts}` (MPICH's `-hosts h0:2,h1:2`) and
`{hostfile}` (an Open MPI hostfile it writes beside the checkpoints). A job that lost a host resumes from its
checkpoint at that P (resume across P is exact); GNN_DIST_FIRST_NUM_PARTS tells the job the P it started at
(its final record reports `first_num_parts`).
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gnn_dist.plugins.loading import option_values

RESTARTS_ENV = "GNN_DIST_RESTARTS"
FIRST_NUM_PARTS_ENV = "GNN_DIST_FIRST_NUM_PARTS"
PLACEHOLDERS = ("{n}", "{parts}", "{hosts}", "{hostfile}")
EXIT_FINISHED, EXIT_FAILED, EXIT_USAGE, EXIT_SETUP = 0, 1, 2, 3
NEVER_RETRIED = (EXIT_USAGE, EXIT_SETUP)


def restarts_so_far() -> int:
    """How many times a supervisor has restarted this job (0 outside a supervisor)."""
    try:
        return max(0, int(os.environ.get(RESTARTS_ENV, "0")))
    except ValueError:
        return 0


def first_num_parts() -> int | None:
    """The rank count a shrinking supervisor first launched this job at (None outside one)."""
    value = os.environ.get(FIRST_NUM_PARTS_ENV, "")
    return int(value) if value.isdigit() else None


def _say(message: str) -> None:
    print(f"gnn-dist supervise: {message}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    """`gnn-dist supervise`'s own options (the launch command follows --)."""
    parser = argparse.ArgumentParser(prog="gnn-dist supervise", description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-restarts", type=int, default=3, help="restart a failed job at most this many times")
    parser.add_argument("--backoff", type=float, default=5.0, help="seconds to wait before each restart")
    parser.add_argument("--hosts-file", help="the hosts the job may run on (HOST, HOST:SLOTS or HOST slots=N a "
                        "line); with --parts-for, every launch runs on the hosts that still answer")
    parser.add_argument("--parts-for", help="partitions by rank count, e.g. 4:parts4,2:parts2: a launch takes the "
                        "largest that the answering hosts' slots hold")
    parser.add_argument("--probe", default=None, help="the command that tells whether {host} answers (exit 0); "
                        "default: ssh -o BatchMode=yes -o ConnectTimeout=5 {host} true")
    return parser


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        _say("error: give the launch command after --, e.g. gnn-dist supervise -- mpiexec -n 4 gnn-dist train "
             "--parts P --checkpoint-dir D")
        sys.exit(EXIT_USAGE)
    split = argv.index("--")
    parser = build_parser()
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if args.max_restarts < 0 or args.backoff < 0:
        parser.error("--max-restarts and --backoff must be 0 or more")
    if not command:
        parser.error("the launch command after -- is empty")
    placeholders = [p for p in PLACEHOLDERS if any(p in word for word in command)]
    if (args.hosts_file is None) != (args.parts_for is None):
        parser.error("--hosts-file and --parts-for go together (the hosts to run on, the partition for each P)")
    if args.hosts_file is None and (placeholders or args.probe):
        parser.error(f"the launch command holds {', '.join(placeholders) or '--probe'}: give --hosts-file and "
                     f"--parts-for so the supervisor can fill it")
    if args.hosts_file is not None and not {"{n}", "{parts}"} <= set(placeholders):
        parser.error("with --hosts-file the launch command must take {n} and {parts} (and {hosts} or {hostfile}), "
                     "e.g. mpiexec -hosts {hosts} -n {n} gnn-dist train --parts {parts} ...")
    return args, command


class Shrinker:
    """Where each launch runs when the supervisor may shrink the job: the hosts still answering, the largest P
    that has a partition and fits their slots, and the launch command filled in for them."""

    def __init__(self, args: argparse.Namespace, checkpoint_dir: str):
        from gnn_dist.comm.hosts import DEFAULT_PROBE, parse_parts_for, read_hosts_file

        self.hosts = read_hosts_file(args.hosts_file)
        self.parts_for = parse_parts_for(args.parts_for)
        self.probe = args.probe or DEFAULT_PROBE
        self.hostfile = Path(checkpoint_dir) / "supervise-hostfile"
        self.first: int | None = None
        self.last: int | None = None

    def launch(self, command: list[str]) -> list[str] | str:
        """The command for this launch, or the line that says why no launch is possible."""
        from gnn_dist.comm.hosts import answering, hydra_hosts, largest_that_fits, open_mpi_hostfile, place

        alive, silent = answering(self.hosts, self.probe)
        slots = sum(host.slots for host in alive)
        if silent:
            _say(f"not answering: {'; '.join(silent)}")
        count = largest_that_fits(self.parts_for, slots)
        if count is None:
            return (f"no partition in --parts-for ({', '.join(map(str, sorted(self.parts_for)))} ranks) fits the "
                    f"{slots} slot(s) of the hosts still answering: not launching")
        placed = place(alive, count)
        if self.last is not None and count != self.last:
            _say(f"relaunching at P={count} (was {self.last}) on {hydra_hosts(placed)}")
        self.first = self.first if self.first is not None else count
        self.last = count
        self.hostfile.parent.mkdir(parents=True, exist_ok=True)
        partial = self.hostfile.with_name(self.hostfile.name + ".partial")
        partial.write_text(open_mpi_hostfile(placed))
        os.replace(partial, self.hostfile)
        values = {"{n}": str(count), "{parts}": self.parts_for[count], "{hosts}": hydra_hosts(placed),
                  "{hostfile}": str(self.hostfile)}
        filled = []
        for word in command:
            for placeholder, value in values.items():
                word = word.replace(placeholder, value)
            filled.append(word)
        return filled


def supervise(argv: list[str]) -> int:
    from gnn_dist.resilience.checkpoint import newest_checkpoint_epoch

    args, command = parse_args(argv)
    checkpoint_dir = (option_values(command, "--checkpoint-dir") or [None])[-1]  # the last wins, as in argparse
    if checkpoint_dir is None:
        _say("error: the train command has no --checkpoint-dir DIR: a restart resumes from it, so add one "
             "(with --checkpoint-every N)")
        return EXIT_USAGE
    try:
        shrinker = Shrinker(args, checkpoint_dir) if args.hosts_file is not None else None
    except (OSError, ValueError) as err:
        _say(f"error: {err}")
        return EXIT_USAGE
    stop_signal: list[int] = []
    child: list[subprocess.Popen] = []

    def forward(signum, _frame) -> None:
        stop_signal.append(signum)
        if child and child[-1].poll() is None:
            child[-1].send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        restarts = 0
        while True:
            run, env = command, {**os.environ, RESTARTS_ENV: str(restarts)}
            if shrinker is not None:
                launch = shrinker.launch(command)
                if isinstance(launch, str):
                    _say(launch)
                    return EXIT_FAILED
                run = launch
                env[FIRST_NUM_PARTS_ENV] = str(shrinker.first)
            run = run + (["--resume"] if restarts and "--resume" not in run else [])
            child.append(subprocess.Popen(run, env=env))
            status = child[-1].wait()
            if stop_signal:
                _say(f"stopped by signal {stop_signal[0]}: not restarting (the job exited with status {status})")
                return status if status > 0 else 128 + stop_signal[0]
            if status == EXIT_FINISHED:
                if restarts:
                    _say(f"the job finished after {restarts} restart(s)")
                return EXIT_FINISHED
            if status in NEVER_RETRIED:
                _say(f"the job refused its input (exit status {status}): not restarting")
                return status
            if restarts >= args.max_restarts:
                _say(f"the job failed (exit status {status}) and --max-restarts {args.max_restarts} is used up: "
                     f"giving up; the last complete checkpoint is in {checkpoint_dir}")
                return status if status > 0 else EXIT_FAILED
            restarts += 1
            epoch = newest_checkpoint_epoch(checkpoint_dir)
            _say(f"the job failed (exit status {status}); restart {restarts} of {args.max_restarts} in "
                 f"{args.backoff:g} s, resuming from epoch {epoch or 0}"
                 + ("" if epoch is not None else f" (no complete checkpoint in {checkpoint_dir} yet)"))
            deadline = time.monotonic() + args.backoff
            while time.monotonic() < deadline and not stop_signal:
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            if stop_signal:
                _say(f"stopped by signal {stop_signal[0]} while waiting to restart")
                return 128 + stop_signal[0]
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
