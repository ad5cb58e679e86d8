package collect

import (
	"os"
	"reflect"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

var returnType = reflect.TypeOf(nvml.SUCCESS)

// driverGone reports whether a bare simulated node's driver library is
// missing right now.
func (s *Simulator) driverGone() bool {
	if s.bareLib == "" {
		return false
	}
	_, err := os.Stat(s.bareLib)
	return err != nil
}

// gateOnDriver makes a bare node's NVML depend on its driver library: Init
// fails with ERROR_LIBRARY_NOT_FOUND and every other call of the library and
// its devices with ERROR_DRIVER_NOT_LOADED while the file is missing.
func (s *Simulator) gateOnDriver(srv *server.Server) {
	init := srv.InitFunc
	srv.InitFunc = func() nvml.Return {
		if s.driverGone() {
			return nvml.ERROR_LIBRARY_NOT_FOUND
		}
		return init()
	}
	s.gateFuncs(reflect.ValueOf(&srv.Interface).Elem())
	for _, d := range s.devs {
		s.gateFuncs(reflect.ValueOf(&d.Device).Elem())
	}
}

// gateFuncs wraps every mock function field (XxxFunc) of the struct v but
// InitFunc: while the driver is gone it returns ERROR_DRIVER_NOT_LOADED in
// every nvml.Return result and zero values elsewhere, without calling the
// mock.
func (s *Simulator) gateFuncs(v reflect.Value) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		fv := v.Field(i)
		if f.Type.Kind() != reflect.Func || !strings.HasSuffix(f.Name, "Func") || f.Name == "InitFunc" || fv.IsNil() {
			continue
		}
		inner := reflect.ValueOf(fv.Interface())
		fv.Set(reflect.MakeFunc(f.Type, func(args []reflect.Value) []reflect.Value {
			if !s.driverGone() {
				return inner.Call(args)
			}
			out := make([]reflect.Value, f.Type.NumOut())
			for j := range out {
				out[j] = reflect.Zero(f.Type.Out(j))
				if f.Type.Out(j) == returnType {
					out[j] = reflect.ValueOf(nvml.ERROR_DRIVER_NOT_LOADED)
				}
			}
			return out
		}))
	}
}
