module github.com/moebench/moebench

go 1.26.8

require (
	github.com/montanaflynn/stats v0.14.0
	github.com/spf13/pflag v1.0.10
)
