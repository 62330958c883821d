#!/usr/bin/env bash
# The published benchmark recipe: every script on its standard environments, SEEDS seeds each, run on
# this machine by benchmark.run_seeds (a worker pool, OMP_NUM_THREADS=1 per job), then a table and
# learning curves per block by benchmark.scores.
#
#   bash benchmark/ppo.sh                           # every block at the full step budgets
#   BLOCKS="classic mujoco" bash benchmark/ppo.sh   # some blocks (or: bash benchmark/ppo.sh classic mujoco)
#   QUICK=1 BLOCKS=classic bash benchmark/ppo.sh    # a check of the recipe: every run a few thousand steps
#
# Blocks and step budgets (the published ones):
#   classic   ppo.py on CartPole-v1 Acrobot-v1 MountainCar-v0, 500k steps
#   mujoco    ppo_continuous_action.py on HalfCheetah-v4 Walker2d-v4 Hopper-v4 InvertedPendulum-v4
#             Humanoid-v4 Pusher-v5 (Pusher-v4 needs mujoco<3), 1M steps, with --save-model
#   atari     ppo_atari.py and ppo_atari_lstm.py on Pong BeamRider Breakout, ppo_atari_envpool.py on
#             Pong-v5 BeamRider-v5 Breakout-v5, 10M steps
#   procgen   ppo_procgen.py on starpilot bossfight bigfish, 25M steps
#   multigpu  ppo_atari_multigpu.py on Breakout through `torchrun --standalone --nproc_per_node=2`, 10M steps
#   sharedmem ppo_shared_memory_lstm.py on CartPole-v1 (500k steps) and, with its Atari flags, on
#             Breakout (10M steps)
#   redis     ppo_continuous_action_redis.py (its own redis-server, 2 samplers) on Hopper-v4
#             HalfCheetah-v4 Walker2d-v4, 1M steps, with --save-model
# The studies of the options (not in the default BLOCKS; each names its runs by --exp-name):
#   objective ppo_continuous_action.py with --policy-objective adaptive-kl (--kl-target 0.01) and fixed-kl
#             (--kl-beta 1) on Hopper-v4 HalfCheetah-v4 Walker2d-v4, 1M steps (clip: the mujoco block)
#   distribution  ppo_continuous_action.py with --distribution beta on Hopper-v4 HalfCheetah-v4 Walker2d-v4
#             InvertedPendulum-v4, 1M steps
#   dmc       ppo_continuous_action.py on dm_control/cartpole-swingup-v0 walker-walk-v0 cheetah-run-v0, 1M steps,
#             and on cartpole-swingup without --bootstrap-truncation
#   bootstrap ppo_continuous_action.py on HalfCheetah-v4 with and without --bootstrap-truncation, seeds 1-10
#             (BOOTSTRAP_SEEDS), and without it on Hopper-v4 Walker2d-v4 InvertedPendulum-v4 Humanoid-v4, 1M steps
#   fullbudget  every script at its published budget on a 2-core CPU, seed 1 (FULL_SEEDS) then seeds 2 and 3
#             (MORE_SEEDS) of the Atari rows, on two lanes of one job each: ppo_shared_memory_lstm.py on CartPole-v1
#             (500k), ppo_atari_multigpu.py on Breakout (torchrun, 2 ranks), then ppo_atari.py on Breakout (more
#             seeds); ppo_atari_lstm.py on Breakout, ppo_atari_envpool.py on Breakout-v5, then on Pong-v5 and
#             BeamRider-v5 (more seeds); 10M steps for Atari; and where a CUDA GPU is (FULL_PROCGEN), a third lane:
#             ppo_procgen.py on starpilot (25M steps). Each run's learning curve is exported as data into
#             RESULTS_DIR/fullbudget/curves while it trains (benchmark.full_budget export); the table beside CleanRL's
#             published scores, RESULTS_DIR/fullbudget.md, and its plots are made from those curves alone; the job
#             logs and unfinished runs' checkpoints go into RESULTS_DIR/fullbudget/resume (benchmark.full_budget stash),
#             which the block puts back (unstash) when it starts on a machine that lost RUNS_DIR
#   parity    early learning on Breakout, 300k steps (PARITY_STEPS): CleanRL's ppo_atari.py,
#             ppo_atari_lstm.py and ppo_atari_envpool.py (benchmark.studies.cleanrl, its own virtualenv, made once
#             with `python -m benchmark.studies.cleanrl build`, which downloads CleanRL and its stack), then
#             ours and ppo_atari_multigpu.py (torchrun, 2 ranks) and ppo_shared_memory_lstm.py (Atari flags);
#             seeds 1-3 for the ppo_atari.py pair and ppo_atari_multigpu.py, 1-2 for the others (SEEDS, when
#             given, for all); the table of the pairs, from every run in the folders: RESULTS_DIR/parity.md
# Every job checkpoints every 10 iterations, and the runner resumes an interrupted block where it stopped
# (benchmark.run_seeds --resume: finished jobs are not run again, the others continue from their checkpoint):
# run the same command again. A fresh benchmark needs a fresh RUNS_DIR.
#
# Variables (default):
#   BLOCKS       the blocks to run, in this order (all of them)
#   SEEDS        the seeds of every script and env ("1 2 3"; the parity block has its own unless it is given)
#   WORKERS      jobs at once (CPU count); the multigpu, sharedmem and redis blocks run half as many
#                (their jobs are several processes each)
#   RUNS_DIR     run folders go to RUNS_DIR/<block>/, one log per job to RUNS_DIR/<block>/logs/
#                (runs/benchmark in the folder ppo.sh is started from; with QUICK=1 runs/benchmark-quick)
#   RESULTS_DIR  the table of a block goes to RESULTS_DIR/<block>.md, its plots to RESULTS_DIR/<block>/
#                (the repository's benchmark/results; with QUICK=1 RUNS_DIR/results)
#   Relative paths are taken from the folder ppo.sh is started from; every path it prints is absolute.
#   QUICK        1: tiny step budgets, for checking that the recipe runs, not for numbers (0)
#   FULL_PROCGEN the fullbudget block's ppo_procgen.py lane: auto (where a CUDA GPU is), 1 (always) or 0 (never)
#   PYTHON       the Python interpreter (the repository's .venv/bin/python that setup.sh makes, else python3);
#   TORCHRUN     the multigpu launcher (torchrun beside that Python)
#
# It installs nothing; each block prints what it needs. A script that is not in the repository yet is
# skipped with a message. The tables read every run under RUNS_DIR/<block>: give a new benchmark a
# fresh RUNS_DIR. Exit code 0 only if every job of every block succeeded.
# Ctrl-C, or SIGTERM to this script (`kill PID`; SIGINT too where it was not ignored when the script started),
# stops every running job at once, in every lane, and starts no next one: exit code 130. So does a job runner
# (benchmark.run_seeds) that is stopped on its own. Run the same command again to go on.
set -uo pipefail

ALL_BLOCKS="classic mujoco atari procgen multigpu sharedmem redis"
STUDIES="objective distribution dmc bootstrap parity fullbudget"
here=$PWD
absolute() { if [[ $1 = /* ]]; then echo "$1"; else echo "$here/$1"; fi; }
[[ -n ${RUNS_DIR:-} ]] && RUNS_DIR=$(absolute "$RUNS_DIR")
[[ -n ${RESULTS_DIR:-} ]] && RESULTS_DIR=$(absolute "$RESULTS_DIR")
cd "$(dirname "$0")/.."
repo=$PWD

BLOCKS=${*:-${BLOCKS:-$ALL_BLOCKS}}
seeds_given=${SEEDS:+yes}  # the parity block has seeds of its own unless SEEDS is given
SEEDS=${SEEDS:-1 2 3}
QUICK=${QUICK:-0}
WORKERS=${WORKERS:-$(getconf _NPROCESSORS_ONLN)}  # not nproc, which obeys OMP_NUM_THREADS
if [[ -x $repo/.venv/bin/python ]]; then default_python=$repo/.venv/bin/python; else default_python=python3; fi
PYTHON=${PYTHON:-$default_python}
TORCHRUN=${TORCHRUN:-$(dirname "$(command -v "$PYTHON")")/torchrun}
if [[ $QUICK == 1 ]]; then
    RUNS_DIR=${RUNS_DIR:-$here/runs/benchmark-quick}
    RESULTS_DIR=${RESULTS_DIR:-$RUNS_DIR/results}
else
    RUNS_DIR=${RUNS_DIR:-$here/runs/benchmark}
    RESULTS_DIR=${RESULTS_DIR:-$repo/benchmark/results}
fi
for block in $BLOCKS; do
    [[ " $ALL_BLOCKS $STUDIES " == *" $block "* ]] || { echo "unknown block '$block' (blocks: $ALL_BLOCKS $STUDIES)" >&2; exit 2; }
done
FULL_PROCGEN=${FULL_PROCGEN:-auto}
[[ $FULL_PROCGEN =~ ^(auto|0|1)$ ]] || { echo "FULL_PROCGEN must be auto, 0 or 1, not '$FULL_PROCGEN'" >&2; exit 2; }
echo "== runs and logs go to $RUNS_DIR/<block>/, tables and plots to $RESULTS_DIR/"
status=0
child= lane= gpu_lane= watcher=  # the command this shell waits for; the fullbudget block's other lanes and watcher

# interrupted: stops what runs (SIGTERM: a job runner ends its jobs, a lane its runner), waits for it, exits 130
interrupted() {
    trap '' INT TERM
    [[ $BASHPID == "$$" ]] && echo "ppo.sh: interrupted" >&2
    [[ -n $child$lane$gpu_lane$watcher ]] && kill -TERM $child $lane $gpu_lane $watcher 2>/dev/null
    wait
    exit 130
}
trap interrupted INT TERM

# wait_for PID: its exit code; a process that was interrupted (130) interrupts this shell too: no next job starts
wait_for() {
    wait "$1"
    local code=$?
    (( code == 130 )) && interrupted
    return $code
}

# run COMMAND...: the command in the background, waited for: a signal reaches the trap above at once (a command in
# the foreground would hold it until the command ended)
run() {
    "$@" &
    child=$!
    wait_for "$child"
    local code=$?
    child=
    return $code
}

# bench BLOCK SCRIPT STEPS QUICK_ARGS ENV_ID...: the script on every env id and seed, through benchmark.run_seeds
# (STEPS: the step budget, then any flags the script needs there; QUICK_ARGS replaces both with QUICK=1)
bench() {
    local block=$1 script=$2 steps=$3 quick_args=$4
    shift 4
    if [[ ! -f $script ]]; then
        echo "== $block: skipping $script, which is not in this repository yet"
        return
    fi
    [[ -n ${SEEDS// /} ]] || return 0  # no seeds asked for (e.g. MORE_SEEDS="")
    local args="--total-timesteps $steps" launch workers=$WORKERS name=${script%.py}
    launch=$(printf %q "$PYTHON")
    [[ $QUICK == 1 ]] && args=$quick_args
    [[ $args =~ --exp-name\ ([^ ]+) ]] && name=${BASH_REMATCH[1]}  # a study's runs: their own logs
    args="$args --checkpoint-every 10"
    if [[ $script == ppo_atari_multigpu.py ]]; then
        launch="$TORCHRUN --standalone --nproc_per_node=2"
    fi
    if [[ $block == multigpu || $block == sharedmem || $block == redis || $script == ppo_atari_multigpu.py \
        || $script == ppo_shared_memory_lstm.py ]]; then
        workers=$(( WORKERS > 1 ? WORKERS / 2 : 1 ))
    fi
    echo "== $block: $script on $* (seeds $SEEDS) $args"
    local command="$launch $script $args --runs-dir $(printf %q "$RUNS_DIR/$block")"
    run "$PYTHON" -m benchmark.run_seeds --command "$command" --env-ids "$@" --seeds $SEEDS --workers "$workers" \
        --logs "$RUNS_DIR/$block/logs/$name" --resume || status=1
}

# results BLOCK: the block's table and learning curves, from every run under RUNS_DIR/BLOCK
results() {
    [[ -d $RUNS_DIR/$1 ]] || return 0
    run "$PYTHON" -m benchmark.scores "$RUNS_DIR/$1" --out "$RESULTS_DIR/$1.md" --plots "$RESULTS_DIR/$1" || status=1
}

# the whole loop in one group, read in full before it runs: an edit of this file does not reach a running block
{
for block in $BLOCKS; do
    case $block in
    classic)
        echo "== classic needs: gymnasium[classic-control] (requirements.txt)"
        bench classic ppo.py 500000 "--total-timesteps 2048" CartPole-v1 Acrobot-v1 MountainCar-v0
        ;;
    mujoco)
        echo "== mujoco needs: mujoco>=3 and gymnasium[mujoco] (requirements.txt)"
        bench mujoco ppo_continuous_action.py "1000000 --save-model" "--total-timesteps 4096 --save-model" \
            HalfCheetah-v4 Walker2d-v4 Hopper-v4 InvertedPendulum-v4 Humanoid-v4 Pusher-v5
        ;;
    atari)
        echo "== atari needs: ale-py (ROMs bundled), envpool, opencv-python-headless (requirements.txt)"
        bench atari ppo_atari.py 10000000 "--total-timesteps 2048" Pong BeamRider Breakout
        bench atari ppo_atari_lstm.py 10000000 "--total-timesteps 2048" Pong BeamRider Breakout
        bench atari ppo_atari_envpool.py 10000000 "--total-timesteps 2048" Pong-v5 BeamRider-v5 Breakout-v5
        ;;
    procgen)
        echo "== procgen needs: envpool (requirements.txt), whose Procgen needs the Qt 5 runtime" \
             "(system package libqt5gui5 on Debian/Ubuntu)"
        bench procgen ppo_procgen.py 25000000 "--total-timesteps 1024 --num-envs 8 --num-steps 64" \
            starpilot bossfight bigfish
        ;;
    multigpu)
        echo "== multigpu needs: torchrun (installed with torch), ale-py (requirements.txt);" \
             "one GPU per process for the published setting"
        bench multigpu ppo_atari_multigpu.py 10000000 "--total-timesteps 2048" Breakout
        ;;
    sharedmem)
        echo "== sharedmem needs: gymnasium[classic-control], ale-py (requirements.txt)"
        bench sharedmem ppo_shared_memory_lstm.py 500000 "--total-timesteps 2048" CartPole-v1
        atari_flags="--num-workers 4 --num-envs-per-worker 2 --seq-len 128 --clip-coef 0.1 --learning-rate 2.5e-4"
        bench sharedmem ppo_shared_memory_lstm.py "10000000 $atari_flags" "--total-timesteps 2048 $atari_flags" Breakout
        ;;
    redis)
        echo "== redis needs: mujoco>=3, gymnasium[mujoco], redis (requirements.txt) and the redis-server" \
             "program (system package redis-server on Debian/Ubuntu)"
        bench redis ppo_continuous_action_redis.py "1000000 --save-model" "--total-timesteps 4096 --save-model" Hopper-v4 HalfCheetah-v4 Walker2d-v4
        ;;
    objective)
        for objective in adaptive-kl fixed-kl; do
            bench objective ppo_continuous_action.py "1000000 --policy-objective $objective --exp-name ppo_continuous_action_${objective/-/_}" \
                "--total-timesteps 4096 --policy-objective $objective --exp-name ppo_continuous_action_${objective/-/_}" \
                Hopper-v4 HalfCheetah-v4 Walker2d-v4
        done
        ;;
    distribution)
        bench distribution ppo_continuous_action.py "1000000 --distribution beta --exp-name ppo_continuous_action_beta" \
            "--total-timesteps 4096 --distribution beta --exp-name ppo_continuous_action_beta" \
            Hopper-v4 HalfCheetah-v4 Walker2d-v4 InvertedPendulum-v4
        ;;
    dmc)
        echo "== dmc needs: dm-control, shimmy (requirements.txt)"
        bench dmc ppo_continuous_action.py 1000000 "--total-timesteps 4096" \
            dm_control/cartpole-swingup-v0 dm_control/walker-walk-v0 dm_control/cheetah-run-v0
        # every DeepMind Control episode ends at its time limit: the bootstrap's share of the gap to CleanRL
        nb="--no-bootstrap-truncation --exp-name ppo_continuous_action_no_bootstrap"
        bench dmc ppo_continuous_action.py "1000000 $nb" "--total-timesteps 4096 $nb" dm_control/cartpole-swingup-v0
        ;;
    bootstrap)
        nb="--no-bootstrap-truncation --exp-name ppo_continuous_action_no_bootstrap"
        SEEDS=${BOOTSTRAP_SEEDS:-$(seq 1 10)} bench bootstrap ppo_continuous_action.py 1000000 "--total-timesteps 4096" HalfCheetah-v4
        SEEDS=${BOOTSTRAP_SEEDS:-$(seq 1 10)} bench bootstrap ppo_continuous_action.py "1000000 $nb" "--total-timesteps 4096 $nb" HalfCheetah-v4
        bench bootstrap ppo_continuous_action.py "1000000 $nb" "--total-timesteps 4096 $nb" \
            Hopper-v4 Walker2d-v4 InvertedPendulum-v4 Humanoid-v4
        ;;
    fullbudget)
        # Every script at its published budget, one job at a time in each of two lanes side by side (a core each;
        # ppo_atari_multigpu.py's two ranks share them): the rows first (seed FULL_SEEDS), then more seeds
        # (MORE_SEEDS) of the Atari rows; every EXPORT_EVERY seconds a watcher exports every run's curve into
        # RESULTS_DIR/fullbudget/curves, stashes the job logs and unfinished runs' checkpoints into
        # RESULTS_DIR/fullbudget/resume and remakes the table from the curves, so that the rows outlive RUNS_DIR
        full=${FULL_SEEDS:-1} more=${MORE_SEEDS-2 3}  # MORE_SEEDS="": none
        # a machine that lost RUNS_DIR: the job logs and the unfinished runs' checkpoints come back from the stash
        stash=$RESULTS_DIR/fullbudget/resume
        [[ -d $stash ]] && { run "$PYTHON" -m benchmark.full_budget unstash "$stash" "$RUNS_DIR/fullbudget" || status=1; }
        export_curves() {  # the curves as data, the stash, then the table and plots made from the curves alone
            run "$PYTHON" -m benchmark.full_budget export "$RUNS_DIR/fullbudget" --curves "$RESULTS_DIR/fullbudget/curves" \
                && run "$PYTHON" -m benchmark.full_budget stash "$RUNS_DIR/fullbudget" --to "$stash" \
                && run "$PYTHON" -m benchmark.full_budget table "$RESULTS_DIR/fullbudget/curves" \
                    --out "$RESULTS_DIR/fullbudget.md" --plots "$RESULTS_DIR/fullbudget"
        }
        (
            trap 'kill $! 2> /dev/null; exit 0' INT TERM  # (a sleep waited for in the background: the trap runs at once)
            while true; do
                sleep "${EXPORT_EVERY:-600}" &
                wait $!
                export_curves > /dev/null
            done
        ) &
        watcher=$!
        (
            trap interrupted INT TERM  # Ctrl-C, or the SIGTERM the first lane sends it, stops its runner too
            SEEDS="$full $more" WORKERS=1 bench fullbudget ppo_shared_memory_lstm.py 500000 "--total-timesteps 2048" CartPole-v1
            SEEDS=$full WORKERS=1 bench fullbudget ppo_atari_multigpu.py 10000000 "--total-timesteps 2048" Breakout
            SEEDS=$more WORKERS=1 bench fullbudget ppo_atari.py 10000000 "--total-timesteps 2048" Breakout
            exit $status
        ) &
        lane=$!
        # ppo_procgen.py on starpilot, 25M steps: about 122 h on a 2-core CPU at its 57 SPS, about an hour on one GPU;
        # a third lane where a CUDA GPU is (FULL_PROCGEN=auto), or always (1), or never (0)
        procgen=$FULL_PROCGEN
        if [[ $procgen == auto ]]; then
            "$PYTHON" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2> /dev/null && procgen=1 || procgen=0
            (( procgen )) || echo "== fullbudget: ppo_procgen.py on starpilot runs where a CUDA GPU is" \
                "(about 122 h on a 2-core CPU); FULL_PROCGEN=1 runs it here"
        fi
        if (( procgen )); then
            (
                trap interrupted INT TERM
                SEEDS=$full WORKERS=1 bench fullbudget ppo_procgen.py 25000000 \
                    "--total-timesteps 1024 --num-envs 8 --num-steps 64" starpilot
                exit $status
            ) &
            gpu_lane=$!
        fi
        SEEDS=$full WORKERS=1 bench fullbudget ppo_atari_lstm.py 10000000 "--total-timesteps 2048" Breakout
        SEEDS=$full WORKERS=1 bench fullbudget ppo_atari_envpool.py 10000000 "--total-timesteps 2048" Breakout-v5
        SEEDS=$more WORKERS=1 bench fullbudget ppo_atari_envpool.py 10000000 "--total-timesteps 2048" Pong-v5 BeamRider-v5
        wait_for $lane || status=1
        lane=
        if [[ -n $gpu_lane ]]; then
            wait_for $gpu_lane || status=1
            gpu_lane=
        fi
        kill -TERM $watcher 2> /dev/null
        wait $watcher
        watcher=
        export_curves || status=1
        continue  # its own table: a row per run beside the published scores
        ;;
    parity)
        steps=${PARITY_STEPS:-300000}
        [[ $QUICK == 1 ]] && steps=2048
        echo "== parity needs: CleanRL's own virtualenv (python -m benchmark.studies.cleanrl build), envpool, ale-py"
        # the seeds of results/parity.md: three for the ppo_atari.py pair and ppo_atari_multigpu.py, two for the others
        three="1 2 3" two="1 2"
        [[ -n $seeds_given ]] && three=$SEEDS two=$SEEDS
        run "$PYTHON" -m benchmark.studies.cleanrl parity run --runs-dir "$RUNS_DIR/parity-cleanrl" --steps "$steps" \
            --scripts ppo_atari --seeds $three --workers "$WORKERS" || status=1
        run "$PYTHON" -m benchmark.studies.cleanrl parity run --runs-dir "$RUNS_DIR/parity-cleanrl" --steps "$steps" \
            --scripts ppo_atari_envpool ppo_atari_lstm --seeds $two --workers "$WORKERS" || status=1
        SEEDS=$three bench parity ppo_atari.py "$steps" "--total-timesteps 2048" Breakout
        SEEDS=$two bench parity ppo_atari_envpool.py "$steps" "--total-timesteps 2048" Breakout-v5
        SEEDS=$two bench parity ppo_atari_lstm.py "$steps" "--total-timesteps 2048" Breakout
        SEEDS=$three bench parity ppo_atari_multigpu.py "$steps" "--total-timesteps 2048" Breakout
        atari_flags="--num-workers 4 --num-envs-per-worker 2 --seq-len 128 --clip-coef 0.1 --learning-rate 2.5e-4"
        SEEDS=$two bench parity ppo_shared_memory_lstm.py "$steps $atari_flags" "--total-timesteps 2048 $atari_flags" \
            Breakout
        run "$PYTHON" -m benchmark.studies.cleanrl parity table --ours "$RUNS_DIR/parity" --cleanrl "$RUNS_DIR/parity-cleanrl" --steps "$steps" \
            --out "$RESULTS_DIR/parity.md" --plots "$RESULTS_DIR/parity" || status=1
        continue  # its own table: the pairs, not the generic one
        ;;
    esac
    results "$block"
done
exit $status
}
