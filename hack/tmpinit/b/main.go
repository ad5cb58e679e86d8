package main

import (
	"fmt"
	"os"
	"strings"

	_ "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	_ "sigs.k8s.io/controller-runtime"
	_ "github.com/ray-project/kuberay/ray-operator/controllers/ray/common"
	_ "github.com/ray-project/kuberay/ray-operator/controllers/ray/utils/dashboardclient"
	_ "sigs.k8s.io/controller-runtime/pkg/manager"
)

func main() {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "Rss") {
			fmt.Println(l)
		}
	}
}
