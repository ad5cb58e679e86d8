package assets

import (
	"encoding/json"
	"maps"
	"regexp"
	"slices"
	"testing"
)

// Grafana's own variables, which a dashboard may use without defining.
var grafanaBuiltins = []string{"__rate_interval", "__interval", "__range"}

// The dashboards as Grafana reads them: the JSON, not Loom's structs.
type grafanaDashboard struct {
	UID           string `json:"uid"`
	Title         string `json:"title"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Query      string `json:"query"`
			Datasource *struct {
				UID string `json:"uid"`
			} `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
	Panels []grafanaPanel `json:"panels"`
}

type grafanaPanel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		RefID      string `json:"refId"`
		Expr       string `json:"expr"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
	} `json:"targets"`
}

func TestDashboards(t *testing.T) {
	all := Dashboards()
	if got := slices.Sorted(maps.Keys(all)); !slices.Equal(got, []string{FleetDashboard, WorkloadDashboard}) {
		t.Fatalf("dashboards %v", got)
	}
	if !maps.Equal(all, Dashboards()) {
		t.Error("Dashboards is not deterministic")
	}
	wantVars := map[string][]string{
		FleetDashboard:    {"datasource", "node", "namespace"},
		WorkloadDashboard: {"datasource", "namespace", "trainingjob", "raycluster"},
	}
	uids := map[string]bool{}
	for file, text := range all {
		t.Run(file, func(t *testing.T) {
			var d grafanaDashboard
			if err := json.Unmarshal([]byte(text), &d); err != nil {
				t.Fatal(err)
			}
			if d.UID == "" || uids[d.UID] || d.Title == "" || d.SchemaVersion == 0 {
				t.Errorf("uid %q (unique?), title %q, schemaVersion %d", d.UID, d.Title, d.SchemaVersion)
			}
			uids[d.UID] = true

			var vars []string
			for _, v := range d.Templating.List {
				vars = append(vars, v.Name)
				switch {
				case v.Type == "datasource" && v.Query != "prometheus":
					t.Errorf("datasource variable %s picks %q", v.Name, v.Query)
				case v.Type == "query" && (v.Datasource == nil || v.Datasource.UID != "${datasource}"):
					t.Errorf("variable %s does not query the chosen datasource", v.Name)
				}
			}
			if !slices.Equal(vars, wantVars[file]) {
				t.Errorf("variables %v, want %v", vars, wantVars[file])
			}
			if d.Templating.List[0].Type != "datasource" {
				t.Error("the first variable is not the datasource")
			}
			checkPanels(t, d.Panels)
			checkVariableUse(t, text, vars)
		})
	}
}

func checkPanels(t *testing.T, panels []grafanaPanel) {
	t.Helper()
	ids := map[int]bool{}
	graphs := 0
	for i, p := range panels {
		if ids[p.ID] || p.Title == "" {
			t.Errorf("panel %d: id %d repeated, or no title", i, p.ID)
		}
		ids[p.ID] = true
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("%s: gridPos %+v leaves the 24 columns", p.Title, g)
		}
		for _, q := range panels[:i] {
			o := q.GridPos
			if g.X < o.X+o.W && o.X < g.X+g.W && g.Y < o.Y+o.H && o.Y < g.Y+g.H {
				t.Errorf("%s overlaps %s", p.Title, q.Title)
			}
		}
		if p.Type == "row" {
			continue
		}
		graphs++
		if p.Type != "timeseries" && p.Type != "stat" {
			t.Errorf("%s: panel type %q", p.Title, p.Type)
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("%s: no datasource variable or no targets", p.Title)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.Expr == "" || tg.RefID == "" || refs[tg.RefID] || tg.Datasource.UID != "${datasource}" {
				t.Errorf("%s: target %+v", p.Title, tg)
			}
			refs[tg.RefID] = true
		}
	}
	if graphs < 6 {
		t.Errorf("%d panels with queries", graphs)
	}
}

// checkVariableUse fails on a $variable the dashboard does not define: its
// panels would show nothing.
func checkVariableUse(t *testing.T, text string, vars []string) {
	t.Helper()
	for _, m := range regexp.MustCompile(`\$\{?([A-Za-z_]\w*)`).FindAllStringSubmatch(text, -1) {
		if !slices.Contains(vars, m[1]) && !slices.Contains(grafanaBuiltins, m[1]) {
			t.Errorf("$%s is not a variable of the dashboard", m[1])
		}
	}
}
