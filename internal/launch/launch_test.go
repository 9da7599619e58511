package launch

import (
	"strings"
	"testing"
)

// TestDetect reads each launcher's variables, prefers moebench's own, then
// MPI's and torchrun's over srun's (which launches them), ignores a Slurm
// batch script's variables (no job step), and names a bad variable.
func TestDetect(t *testing.T) {
	cases := []struct {
		env                    map[string]string
		rank, world, local, lw int
		via, job, err          string
	}{
		{env: map[string]string{}, world: 1, lw: 1},
		{env: map[string]string{"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4", "SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"},
			rank: 3, world: 4, local: 1, lw: 2, via: "srun (SLURM_PROCID=3, SLURM_STEP_NUM_TASKS=4, SLURM_LOCALID=1)", job: "77.0"},
		{env: map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "77"}, world: 1, lw: 1}, // the batch script
		{env: map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2"},
			rank: 1, world: 2, lw: 1, via: "mpirun (Open MPI)"},
		{env: map[string]string{"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "n0", "MASTER_PORT": "29500"},
			rank: 5, world: 8, local: 1, lw: 4, via: "torchrun"},
		{env: map[string]string{"MOEBENCH_RANK": "1", "MOEBENCH_WORLD": "2", "RANK": "7", "WORLD_SIZE": "9"}, rank: 1, world: 2, lw: 1, via: "MOEBENCH_RANK/MOEBENCH_WORLD"},
		{env: map[string]string{"PMI_RANK": "2", "PMI_SIZE": "2"}, err: "PMI_RANK=2: must be < PMI_SIZE (2)"},
		{env: map[string]string{"MOEBENCH_RANK": "x", "MOEBENCH_WORLD": "2"}, err: `MOEBENCH_RANK="x": must be an integer ≥ 0`},
		{env: map[string]string{"MOEBENCH_RANK": "1"}, err: "MOEBENCH_RANK=1 without MOEBENCH_WORLD: "},
		{env: map[string]string{"MOEBENCH_WORLD": "2", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2"}, err: "MOEBENCH_WORLD=2 without MOEBENCH_RANK: "},
	}
	for i, c := range cases {
		l, err := Detect(func(k string) string { return c.env[k] })
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("case %d: %v, want %q", i, err, c.err)
			}
			continue
		}
		if err != nil || l.Rank != c.rank || l.World != c.world || l.Local != c.local || l.LocalWorld != c.lw || !strings.HasPrefix(l.Via, c.via) || l.Job != c.job {
			t.Errorf("case %d: %+v, %v", i, l, err)
		}
	}
}
