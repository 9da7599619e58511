// Package launch finds a distributed run's place among its processes —
// which process this is, of how many, on which node — from what the
// launcher set (srun, mpirun, torchrun, or moebench's own MOEBENCH_RANK
// and MOEBENCH_WORLD), shares NCCL's unique id between the processes
// (NCCL_COMM_ID, or a file rank 0 writes on a shared filesystem), and
// watches the run so that a process that fails, is killed or hangs makes
// every other one stop, naming it, instead of hanging. NCCL moves the
// data; nothing here is a network layer.
//
// Runs over several processes and nodes: docs/multinode.md.
package launch

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Launch is this process's place in a run.
type Launch struct {
	Rank, World int    // this process, of World (0 ≤ Rank < World)
	Local       int    // its place among the processes of its node (the first GPU it drives follows from it)
	LocalWorld  int    // the processes of its node (1 when the launcher does not say)
	Via         string // the launcher and the variables read, e.g. "srun (SLURM_PROCID=1, SLURM_STEP_NUM_TASKS=2)"
	Job         string // the launcher's job id ("" when it gives none): scopes the rendezvous file
	Host        string // the node's name: MOEBENCH_NODE, else its hostname
	WorldVar    string // the launcher's variable that gives World, e.g. "MOEBENCH_WORLD"
}

// Distributed: more than one process.
func (l Launch) Distributed() bool { return l.World > 1 }

// launchers are the variables each launcher sets, in the order they are
// looked for: moebench's own first, then MPI's (mpirun under a Slurm
// allocation also sees SLURM_* of its own daemons' step), torchrun's (run
// by srun, it sets RANK per worker), and srun's last (SLURM_STEP_NUM_TASKS,
// which only a job step launched by srun has, not the batch script).
var launchers = []struct {
	name, rank, world, local, localWorld string
	job                                  []string
}{
	{"MOEBENCH_RANK/MOEBENCH_WORLD", "MOEBENCH_RANK", "MOEBENCH_WORLD", "MOEBENCH_LOCAL_RANK", "MOEBENCH_LOCAL_WORLD", []string{"MOEBENCH_JOB"}},
	{"mpirun (Open MPI)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", []string{"OMPI_MCA_orte_ess_jobid", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"}},
	{"mpirun (PMI: MPICH, Intel MPI)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", []string{"PMI_JOBID"}},
	{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", []string{"TORCHELASTIC_RUN_ID"}},
	{"srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE", []string{"SLURM_JOB_ID", "SLURM_STEP_ID"}},
}

// Detect reads the launch from getenv (os.Getenv in the program): the
// first launcher whose rank and world variables are both set; the node is
// named by MOEBENCH_NODE, else the hostname. Without
// one, a single process (World 1). A variable that is not a number, or a
// rank outside [0, world), is an error naming it.
func Detect(getenv func(string) string) (Launch, error) {
	host, _ := os.Hostname()
	if n := getenv("MOEBENCH_NODE"); n != "" { // where hostnames do not tell nodes apart
		host = n
	}
	for i, k := range launchers {
		rs, ws := getenv(k.rank), getenv(k.world)
		if i == 0 && (rs == "") != (ws == "") { // moebench's own: one without the other is a mistake, not one process
			set, unset := k.rank+"="+rs, k.world
			if rs == "" {
				set, unset = k.world+"="+ws, k.rank
			}
			return Launch{}, fmt.Errorf("%s without %s: a run over several processes sets both on every process (%s: this process's place, from 0; %s: the run's number of processes); a run of one process sets neither",
				set, unset, k.rank, k.world)
		}
		if rs == "" || ws == "" {
			continue
		}
		l := Launch{Host: host, LocalWorld: 1, WorldVar: k.world}
		var err error
		if l.World, err = number(k.world, ws, 1); err != nil {
			return Launch{}, err
		}
		if l.Rank, err = number(k.rank, rs, 0); err != nil {
			return Launch{}, err
		}
		if l.Rank >= l.World {
			return Launch{}, fmt.Errorf("%s=%d: must be < %s (%d)", k.rank, l.Rank, k.world, l.World)
		}
		l.Via = fmt.Sprintf("%s (%s=%d, %s=%d", k.name, k.rank, l.Rank, k.world, l.World)
		if s := getenv(k.local); s != "" {
			if l.Local, err = number(k.local, s, 0); err != nil {
				return Launch{}, err
			}
			l.Via += fmt.Sprintf(", %s=%d", k.local, l.Local)
		}
		// srun's tasks per node read "4" or "4(x2)" or "4,2": this node's
		// count is the local world when every node has the same
		if s := getenv(k.localWorld); s != "" {
			if n, err := strconv.Atoi(strings.SplitN(strings.SplitN(s, "(", 2)[0], ",", 2)[0]); err == nil && n > l.Local {
				l.LocalWorld = n
			}
		}
		l.LocalWorld = max(l.LocalWorld, l.Local+1)
		l.Via += ")"
		var job []string
		for _, j := range k.job {
			if v := getenv(j); v != "" {
				job = append(job, v)
			}
		}
		l.Job = strings.Join(job, ".")
		return l, nil
	}
	return Launch{World: 1, LocalWorld: 1, Host: host}, nil
}

// worldName names what gives the run's number of processes.
func (l Launch) worldName() string {
	if l.WorldVar != "" {
		return l.WorldVar
	}
	return "the number of processes"
}

// worldSetting is the run's number of processes as a setting every
// process must share.
func (l Launch) worldSetting() Setting {
	return Setting{l.worldName(), strconv.Itoa(l.World)}
}

// number parses variable name's value v, at least lo.
func number(name, v string, lo int) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < lo {
		return 0, fmt.Errorf("%s=%q: must be an integer ≥ %d (set by the launcher)", name, v, lo)
	}
	return n, nil
}
