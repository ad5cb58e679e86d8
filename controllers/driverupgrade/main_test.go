package driverupgrade

import (
	"testing"

	"github.com/loom-dev/loom/internal/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.Main(m, &env) }
