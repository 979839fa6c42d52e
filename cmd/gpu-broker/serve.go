package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/nomad-gpu/nomad-gpu/broker/agent"
	"github.com/nomad-gpu/nomad-gpu/broker/config"
)

func serve(args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	path := fs.String("config", "", "broker configuration file (HCL)")
	level := fs.String("log-level", "info", "trace, debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "gpu-broker", Level: hclog.LevelFromString(*level)})
	if err := serveErr(*path, log); err != nil {
		log.Error("broker stopped", "error", err)
		return 1
	}
	return 0
}

func serveErr(path string, log hclog.Logger) error {
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	return agent.New(cfg, log, hup).Run(ctx)
}
