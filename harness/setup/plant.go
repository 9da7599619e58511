package setup

import (
	"fmt"
	"os"
	"strings"
	"time"
)

// PlantEnv names the planted delay, a hook for tests ONLY: with
// MOEBENCH_TEST_PLANT_DELAY=NAME=DURATION[,NAME=DURATION...] every timed
// step of dispatcher NAME on the host device takes DURATION longer (rank 0
// sleeps inside its first timed phase), so that a test can make one design
// clearly slower than another and see 'moebench advise' tell them apart.
// It measures nothing: a record made with it says so in its clock note,
// and its stack records the variable (records made with and without it are
// never compared).
const PlantEnv = "MOEBENCH_TEST_PLANT_DELAY"

// maxPlant bounds a planted delay.
const maxPlant = time.Minute

// PlantedDelay is the delay PlantEnv plants in each timed step of
// dispatcher, 0 when none.
func PlantedDelay(dispatcher string) (time.Duration, error) {
	v := os.Getenv(PlantEnv)
	if v == "" {
		return 0, nil
	}
	for _, item := range strings.Split(v, ",") {
		name, d, ok := strings.Cut(strings.TrimSpace(item), "=")
		dur, err := time.ParseDuration(d)
		if !ok || err != nil || dur < 0 || dur > maxPlant {
			return 0, fmt.Errorf("%s=%q: want NAME=DURATION[,NAME=DURATION...] with each duration in [0, %v] (a test-only hook)", PlantEnv, v, maxPlant)
		}
		if name == dispatcher {
			return dur, nil
		}
	}
	return 0, nil
}

// PlantNote is the clock note of a run with a planted delay.
func PlantNote(d time.Duration) string {
	return fmt.Sprintf("TEST-ONLY: %s planted %v in every timed step of this dispatcher (rank 0's first phase); these times are not measurements", PlantEnv, d)
}
