package assets

import (
	"bytes"
	"encoding/json"

	"k8s.io/utils/ptr"
)

// The part of Grafana's dashboard JSON model Loom's dashboards use. Struct
// fields marshal in their order, so the output is deterministic.

type dashboard struct {
	UID           string     `json:"uid"`
	Title         string     `json:"title"`
	Description   string     `json:"description,omitempty"`
	Tags          []string   `json:"tags"`
	Editable      bool       `json:"editable"`
	GraphTooltip  int        `json:"graphTooltip"`
	Refresh       string     `json:"refresh"`
	SchemaVersion int        `json:"schemaVersion"`
	Version       int        `json:"version"`
	Time          timeRange  `json:"time"`
	Timezone      string     `json:"timezone"`
	Templating    templating `json:"templating"`
	Panels        []panel    `json:"panels"`
}

type timeRange struct {
	From string `json:"from"`
	To   string `json:"to"`
}

type templating struct {
	List []variable `json:"list"`
}

// variable is a template variable: a datasource, a query (label_values) or
// a custom list.
type variable struct {
	Name       string         `json:"name"`
	Label      string         `json:"label"`
	Type       string         `json:"type"`
	Datasource *datasourceRef `json:"datasource,omitempty"`
	Query      string         `json:"query"`
	Definition string         `json:"definition,omitempty"`
	// Refresh 1 reloads the values with the dashboard, 2 with the time range.
	Refresh    int    `json:"refresh"`
	Regex      string `json:"regex,omitempty"`
	Multi      bool   `json:"multi"`
	IncludeAll bool   `json:"includeAll"`
	AllValue   string `json:"allValue,omitempty"`
	// Sort 1 sorts alphabetically.
	Sort int `json:"sort"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID          int            `json:"id"`
	Type        string         `json:"type"`
	Title       string         `json:"title"`
	Description string         `json:"description,omitempty"`
	GridPos     gridPos        `json:"gridPos"`
	Datasource  *datasourceRef `json:"datasource,omitempty"`
	FieldConfig *fieldConfig   `json:"fieldConfig,omitempty"`
	Targets     []target       `json:"targets,omitempty"`
	// Collapsed and Panels are a row's.
	Collapsed *bool   `json:"collapsed,omitempty"`
	Panels    []panel `json:"panels,omitempty"`
}

type gridPos struct {
	H int `json:"h"`
	W int `json:"w"`
	X int `json:"x"`
	Y int `json:"y"`
}

type fieldConfig struct {
	Defaults  fieldDefaults `json:"defaults"`
	Overrides []struct{}    `json:"overrides"`
}

type fieldDefaults struct {
	Unit       string      `json:"unit,omitempty"`
	Min        *float64    `json:"min,omitempty"`
	Max        *float64    `json:"max,omitempty"`
	Decimals   *int        `json:"decimals,omitempty"`
	Thresholds *thresholds `json:"thresholds,omitempty"`
}

type thresholds struct {
	Mode  string          `json:"mode"`
	Steps []thresholdStep `json:"steps"`
}

// thresholdStep's Value is nil for the base step (JSON null).
type thresholdStep struct {
	Color string   `json:"color"`
	Value *float64 `json:"value"`
}

type target struct {
	RefID        string        `json:"refId"`
	Datasource   datasourceRef `json:"datasource"`
	Expr         string        `json:"expr"`
	LegendFormat string        `json:"legendFormat,omitempty"`
	Instant      bool          `json:"instant,omitempty"`
}

// promDatasource is the datasource every panel and query variable uses: the
// one the dashboard's datasource variable picks.
var promDatasource = datasourceRef{Type: "prometheus", UID: "${datasource}"}

// datasourceVariable lets the viewer pick any Prometheus datasource.
func datasourceVariable() variable {
	return variable{Name: "datasource", Label: "Data source", Type: "datasource", Query: "prometheus", Refresh: 1}
}

// labelValues is a query variable listing the values of label in selector.
// multi allows several values and "All" (allValue, a regex).
func labelValues(name, label, selector, labelName string, multi bool, allValue string) variable {
	q := "label_values(" + selector + ", " + labelName + ")"
	return variable{
		Name: name, Label: label, Type: "query", Datasource: &promDatasource,
		Query: q, Definition: q, Refresh: 2, Sort: 1,
		Multi: multi, IncludeAll: multi, AllValue: allValue,
	}
}

// Units Grafana knows.
const (
	unitPercent     = "percent"     // 0-100
	unitPercentUnit = "percentunit" // 0-1
	unitBytes       = "bytes"
	unitCelsius     = "celsius"
	unitWatt        = "watt"
	unitShort       = "short"
)

// series is one query of a panel and its legend.
type series struct {
	expr, legend string
}

// layout places panels left to right in Grafana's 24-column grid, starting
// a new line when one does not fit, and numbers them.
type layout struct {
	panels []panel
	x, y   int
	lineH  int
	nextID int
}

func (l *layout) place(w, h int) gridPos {
	if l.x+w > 24 {
		l.x, l.y, l.lineH = 0, l.y+l.lineH, 0
	}
	p := gridPos{H: h, W: w, X: l.x, Y: l.y}
	l.x += w
	l.lineH = max(l.lineH, h)
	return p
}

func (l *layout) id() int {
	l.nextID++
	return l.nextID
}

// row starts a titled, expanded row on a new line.
func (l *layout) row(title string) {
	if l.x > 0 {
		l.x, l.y, l.lineH = 0, l.y+l.lineH, 0
	}
	l.panels = append(l.panels, panel{ID: l.id(), Type: "row", Title: title, GridPos: l.place(24, 1), Collapsed: ptr.To(false)})
	l.x, l.y, l.lineH = 0, l.y+1, 0
}

// add places a panel of w×h with the given queries.
func (l *layout) add(kind string, w, h int, title, description string, defaults fieldDefaults, queries ...series) {
	ds := promDatasource
	p := panel{
		ID: l.id(), Type: kind, Title: title, Description: description, GridPos: l.place(w, h),
		Datasource: &ds, FieldConfig: &fieldConfig{Defaults: defaults, Overrides: []struct{}{}},
	}
	for i, q := range queries {
		p.Targets = append(p.Targets, target{
			RefID: string(rune('A' + i)), Datasource: promDatasource, Expr: q.expr, LegendFormat: q.legend,
			Instant: kind == "stat",
		})
	}
	l.panels = append(l.panels, p)
}

// timeseries is a graph panel, 12 columns wide.
func (l *layout) timeseries(title, description string, defaults fieldDefaults, queries ...series) {
	l.add("timeseries", 12, 8, title, description, defaults, queries...)
}

// stat is a single figure, 4 columns wide.
func (l *layout) stat(title, description string, defaults fieldDefaults, q series) {
	l.add("stat", 4, 4, title, description, defaults, q)
}

func unit(u string) fieldDefaults { return fieldDefaults{Unit: u} }

// percentRange is 0-100 %.
func percentRange() fieldDefaults {
	return fieldDefaults{Unit: unitPercent, Min: ptr.To(0.0), Max: ptr.To(100.0)}
}

// redFrom colours a figure green below v and red from it.
func redFrom(u string, v float64) fieldDefaults {
	return fieldDefaults{Unit: u, Thresholds: &thresholds{Mode: "absolute", Steps: []thresholdStep{
		{Color: "green", Value: nil}, {Color: "red", Value: ptr.To(v)},
	}}}
}

// render marshals d as indented JSON; HTML escaping is off so that
// PromQL's < and > stay readable.
func render(d dashboard) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(d); err != nil {
		panic("assets: dashboard " + d.UID + ": " + err.Error())
	}
	return b.String()
}

func newDashboard(uid, title, description string, vars []variable, panels []panel) dashboard {
	return dashboard{
		UID: uid, Title: title, Description: description, Tags: []string{"loom", "gpu"},
		Editable: true, GraphTooltip: 1, Refresh: "1m", SchemaVersion: 39, Version: 1,
		Time: timeRange{From: "now-6h", To: "now"}, Timezone: "browser",
		Templating: templating{List: vars}, Panels: panels,
	}
}
