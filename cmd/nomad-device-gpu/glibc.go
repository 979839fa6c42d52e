package main

// Built with glibc.c, the plugin's start on a glibc older than the one it
// was built against.

import "C"
